"""Which matrix instructions the persistent layer kernel compiles to on Hopper, on any machine (no GPU).

Triton compiles a LocDiT/LocEnc layer's launch (`persistent_layer.layer`'s arguments for the sizes and
token count, as the server would launch it on an H100/H200) for sm_90, then counts the warpgroup MMAs
(`wgmma.mma_async`) and the older `mma.sync` in its PTX, and runs triton's ptxas for registers and spills:

    python3 benchmarks/kernel_sm90_mma.py --tokens 22,44 --launch swap=True --launch prefetch=2
    python3 benchmarks/kernel_sm90_mma.py --tokens 22 --layers 12 --launch swap=True --launch prefetch=2
    python3 benchmarks/kernel_sm90_mma.py --lm --tokens 1 --launch swap=True --launch prefetch=1 --launch balance=True

--lm: an LM decode layer instead (hidden 2048, FFN 6144, paged attention in 16 context splits, as the
engine runs one row on an H100/H200), `tokens` its rows.

Pointer arguments are taken as 16-byte aligned, as triton specialises them at a real launch: without
that its K loops would not be pipelined at all. The launch is `persistent_layer.choose_launch`'s for CPU
tensors (so neither swapped nor prefetching, as off Hopper) with the fields --launch names changed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.kernels import persistent_layer as pl  # noqa: E402
from voxcpm_triton.kernels.fp8 import quantize_weight  # noqa: E402
from cli import launch_field  # noqa: E402

H, HQ, HKV, D, I, EPS = 1024, 16, 2, 128, 4096, 1e-5  # LocDiT's and LocEnc's layer
LM_H, LM_I, LM_SPLITS, LM_BLOCK, LM_WIDTH = 2048, 6144, 16, 16, 512  # the LM's, its splits and table at one row
H100_SMEM, H100_SMS = 232448, 132
TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64",
         torch.float8_e4m3fn: "*fp8e4nv"}


def launch_arguments(tokens: int, seq_len: int, changes: dict, layers: int = 0,
                     fp8: bool = False, lm: bool = False) -> tuple[tuple, dict]:
    """`persistent_layer.layer`'s launch of a chained layer (h_in given, next_norm asked for) over
    `tokens` zero rows, or (layers) `persistent_layer.stack`'s of that many -> (positional
    arguments, keyword arguments) of its `_layer_kernel` call, as on an H100. fp8: the projections'
    weights in e4m3. lm: an LM decode layer of `tokens` rows (paged)."""
    seen = {}

    class Capture:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.update(args=args, kw=kw)

    saved = (pl._layer_kernel, pl._INTERPRETED, pl._smem, pl._programs, pl._sync, pl.choose_launch)
    chosen = pl.choose_launch
    pl._layer_kernel, pl._INTERPRETED = Capture(), False
    pl._smem, pl._programs = (lambda dev: H100_SMEM), (lambda dev, work: min(work, H100_SMS))
    pl._sync = lambda dev: torch.zeros(2, dtype=torch.int32)
    pl.choose_launch = lambda *a, **k: chosen(*a, **k)._replace(**changes)
    try:
        bf = torch.bfloat16
        h, i = (LM_H, LM_I) if lm else (H, I)
        x, norm = torch.zeros(tokens, h, dtype=bf), torch.ones(h, dtype=bf)
        qkv, o = torch.zeros((HQ + 2 * HKV) * D, h, dtype=bf), torch.zeros(h, HQ * D, dtype=bf)
        gate_up, down = torch.zeros(2 * i, h, dtype=bf), torch.zeros(h, i, dtype=bf)
        if fp8:
            qkv, o, gate_up, down = map(quantize_weight, (qkv, o, gate_up, down))
        cos = sin = torch.zeros(tokens if lm else seq_len, D)
        paged = None
        if lm:
            pool = torch.zeros(2, LM_BLOCK, HKV, D, dtype=bf)
            rows = torch.zeros(tokens, dtype=torch.int64)
            paged = pl.Paged(pool, pool, torch.zeros(tokens, LM_WIDTH, dtype=torch.int64), rows, rows, LM_SPLITS)
        if layers:
            pl.stack(x, [(norm, qkv, o, norm, gate_up, down)] * layers, norm, cos, sin, seq_len, (HQ, HKV, D), EPS)
        else:
            pl.layer(x, norm, qkv, cos, sin, 1 if lm else seq_len, (HQ, HKV, D), o, norm, gate_up, down, EPS,
                     h_in=x, next_norm=norm, paged=paged)
    finally:
        pl._layer_kernel, pl._INTERPRETED, pl._smem, pl._programs, pl._sync, pl.choose_launch = saved
    return seen["args"], seen["kw"]


def compile_sm90(args: tuple, kw: dict):
    """The kernel compiled for sm_90 with these arguments (ints of 1 specialised, pointers 16-byte aligned)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = pl._layer_kernel
    kw = dict(kw)
    num_warps = kw.pop("num_warps")
    signature, constants, attrs, it = {}, {}, {}, iter(args)
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        if param.is_constexpr:
            signature[name], constants[(i,)] = "constexpr", kw[name]
            continue
        a = kw.pop(name) if name in kw else next(it)
        if isinstance(a, torch.Tensor):
            signature[name], attrs[(i,)] = TYPES[a.dtype], [["tt.divisibility", 16]]
        elif isinstance(a, int) and a == 1:
            signature[name], constants[(i,)] = "constexpr", 1
        elif isinstance(a, int):
            signature[name] = "i32"
            if a % 16 == 0 and a:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    src = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def ptxas_stats(ptx: str) -> str:
    """triton's ptxas -v on the PTX for sm_90a: registers, spills."""
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        r = subprocess.run([ptxas, "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True)
    return " ".join(line.split(":", 1)[-1].strip() for line in r.stderr.splitlines()
                    if "Used" in line or "spill" in line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default=None,
                    help="token counts (default 22,44,10: LocDiT's 22 a request, LocEnc's 5 a request, so 10 at two; "
                         "with --lm, rows: 1)")
    ap.add_argument("--launch", type=launch_field, action="append", default=[], metavar="FIELD=VALUE",
                    help="a persistent_layer.Launch field changed, repeatable (e.g. swap=True)")
    ap.add_argument("--layers", type=int, default=0, help="a stack of this many layers in one launch (0: one layer)")
    ap.add_argument("--fp8", action="store_true", help="the projections' weights in e4m3")
    ap.add_argument("--lm", action="store_true", help="an LM decode layer, paged (tokens: its rows)")
    args = ap.parse_args()
    counts = [int(t) for t in (args.tokens or ("1" if args.lm else "22,44,10")).split(",")]
    if args.lm and (args.layers or max(counts) > pl.MAX_ROWS):
        ap.error(f"--lm: one layer (no --layers) of at most {pl.MAX_ROWS} rows, as the engine launches them")
    changes = dict(args.launch)
    for tokens in counts:
        seq_len = 5 if tokens % 11 else 11
        a, kw = launch_arguments(tokens, seq_len, changes, args.layers, args.fp8, args.lm)
        k = compile_sm90(a, kw)
        ptx = k.asm["ptx"]
        launch = {f: kw[f] for f in ("BLOCK_M", "BN_QKV", "BN_O", "BN_GU", "BN_D", "BLOCK_K", "SWAP", "PF_QKV",
                                     "PF_O", "PF_GU", "PF_D", "C_GU", "LAYERS", "W_FP8", "ATT_SPLITS")}
        print(f"{tokens} tokens {launch}: wgmma {len(re.findall(r'wgmma.mma_async', ptx))}, mma.sync "
              f"{len(re.findall(r'mma.sync', ptx))}, L2 prefetches {len(re.findall(r'prefetch.global.L2', ptx))}, "
              f"shared memory {k.metadata.shared} B; {ptxas_stats(ptx)}", flush=True)


if __name__ == "__main__":
    main()
