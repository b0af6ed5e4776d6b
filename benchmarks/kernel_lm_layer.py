"""An LM decode layer (VoxCPM2's base LM: hidden 2048, 16/2 heads of 128, FFN 6144) at a few rows,
two ways, on a CUDA machine:

- as the engine ran it before: `LayerMath`'s two halves torch.compile'd (cuBLAS GEMMs, inductor's
  norms, RoPE and SiLU) around the Triton paged decode kernel (which writes the new K/V);
- the persistent kernel (`voxcpm_triton.kernels.persistent_layer.layer(paged=...)`): the whole layer
  in one launch, and where its time goes (per phase, from the GPU's global timer in every program).

The LM's 28 layers run in a row, each with its own weights (2.6 GB: the L2 cache does not hold them),
every row at a context of CONTEXT tokens over the engine's table width:

    python3 benchmarks/kernel_lm_layer.py --out $OUT/kernel_lm_layer.json
    python3 benchmarks/kernel_lm_layer.py --fp8 --sweep 1 --variants default --out $OUT/kernel_lm_layer_fp8.json

--fp8: the four projections' weights in e4m3 (`precision` fp8): the compiled path quantises the
activations per token (`kernels.fp8.fp8_linear`), the persistent kernel widens the weights in
registers; the sweep's `default` is then the server's e4m3 launch (K tiles of FP8_BLOCK_K), `unswapped`
the bf16 one (K tiles of 128), `fp8_swap` the e4m3 one with its products swapped.

Microseconds per layer, median of replays of a CUDA graph of the 28; a sweep's launches both as layers
of their own (`us`) and chained as the engine runs them (`chained_us`: each given its input norm by the
layer before; `chained_max_abs_diff` is against the default launch unchained, so it holds chaining's
roundings and the launch's both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from kernel_fused_layer import phase_summary  # noqa: E402
from kernel_skinny_gemm import time_calls  # noqa: E402
from voxcpm_triton.engine.attention import DecodeMetadata, PagedAttention  # noqa: E402
from voxcpm_triton.kernels import persistent_layer as pl  # noqa: E402
from voxcpm_triton.kernels.fp8 import quantize_weight  # noqa: E402
from voxcpm_triton.model.minicpm import LayerMath  # noqa: E402

H, HQ, HKV, D, I, EPS = 2048, 16, 2, 128, 6144, 1e-5
DEPTH, BLOCK, WIDTH = 28, 16, 512  # layers; the engine's block size and table width (8192 positions)
L = pl.Launch()
L8 = pl.launch_for(H, HQ * D, I, fp8=True)  # the e4m3 launch's tiles (K tiles of FP8_BLOCK_K), nothing else on
VARIANTS = {  # name -> launch: None, the server's (pl.choose_launch for the LM's sizes and the GPU), and others
    "default": None, "unswapped": pl.launch_for(H, HQ * D, I), "launch_local": L,
    "gu16": L._replace(blocks=(32, 32, 16, 32)),
    "qkv16_gu16": L._replace(blocks=(16, 32, 16, 32)), "stages8": L._replace(stages=8),
    "gu16_stages8": L._replace(blocks=(32, 32, 16, 32), stages=8), "bk256": L._replace(block_k=256),
    "gu16_split8": L._replace(blocks=(32, 32, 16, 32), splits=(8, 8)), "w8": L._replace(num_warps=8),
    "gu64": L._replace(blocks=(32, 32, 64, 32)), "gu64_d64": L._replace(blocks=(32, 32, 64, 64)),
    "gu64_stages4": L._replace(blocks=(32, 32, 64, 32), stages=4), "gu64_bk64": L._replace(blocks=(32, 32, 64, 32),
                                                                                           block_k=64),
    "o64_gu64_d64": L._replace(blocks=(32, 64, 64, 64)), "qkv64_gu64": L._replace(blocks=(64, 32, 64, 32)),
    # weight rows as the products' M side (wgmma from 64 rows; the server's on Hopper)
    "swap_qkv64": pl.launch_for(H, HQ * D, I)._replace(blocks=(64, 64, 64, 64), swap=True),
    # with --fp8: the e4m3 launch swapped, plain (no prefetch), prefetching K tiles and/or with balanced gate/up items
    "fp8_swap": L8._replace(swap=True), "fp8_plain": L8,
    **{f"fp8_pf{n}": L8._replace(prefetch=n) for n in (1, 2)},
    "fp8_balance": L8._replace(balance=True), "fp8_pf1_balance": L8._replace(prefetch=1, balance=True),
    **{f"pf{n}": pl.launch_for(H, HQ * D, I)._replace(swap=True, prefetch=n) for n in (1, 2, 4, 8)},
}
ONLY: set = set()
PHASES = ["norm", "qkv", "attention (context splits)", "merge splits", "o (split K)", "sum+residual+norm",
          "gate/up+silu", "down (split K)", "sum+residual"]


def weights(dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s, scale: (torch.randn(*s, device=dev, generator=g) * scale).to(torch.bfloat16)  # noqa: E731
    return [(1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(torch.bfloat16),
            r((HQ + 2 * HKV) * D, H, scale=H ** -0.5), r(H, HQ * D, scale=(HQ * D) ** -0.5),
            (1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(torch.bfloat16),
            r(2 * I, H, scale=H ** -0.5), r(H, I, scale=I ** -0.5)]


def case(dev, rows, context):
    """Per row: CONTEXT positions over blocks of its own; one pool per layer -> backends, rope rows."""
    need = -(-context // BLOCK)
    pools = torch.randn(2, DEPTH, 1 + rows * need, BLOCK, HKV, D, device=dev).to(torch.bfloat16)
    bt = torch.zeros(rows, WIDTH, dtype=torch.int64, device=dev)
    bt[:, :need] = 1 + torch.arange(rows * need, device=dev).view(rows, need)
    ctx = torch.full((rows,), context, dtype=torch.int64, device=dev)
    pos = ctx - 1
    slots = bt.gather(1, (pos // BLOCK)[:, None])[:, 0] * BLOCK + pos % BLOCK
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    ang = torch.cat([pos[:, None].float() * inv] * 2, dim=-1)
    return PagedAttention(pools[0], pools[1], DecodeMetadata(slots, bt, ctx), use_triton=True), (ang.cos(), ang.sin())


def paged(backend, i):
    """Layer i's cache and the rows' tables, as `PagedAttention.layer` hands them to the kernel."""
    m = backend.meta
    return pl.Paged(backend.k_pool[i], backend.v_pool[i], m.block_tables, m.context_lens, m.slot_mapping)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--out", default="kernel_lm_layer.json")
    ap.add_argument("--variants", default="", help="only these of VARIANTS (names, comma-separated)")
    ap.add_argument("--sweep", default="", help="rows (of --rows) at which to time the launch variants too")
    ap.add_argument("--fp8", action="store_true", help="the projections' weights in e4m3")
    args = ap.parse_args()
    sweep_rows = {int(r) for r in args.sweep.split(",") if r}
    ONLY.update(v for v in args.variants.split(",") if v)
    dev = torch.device("cuda")
    t0 = time.time()
    layers = [weights(dev, s) for s in range(DEPTH)]
    if args.fp8:
        layers = [[quantize_weight(w) if i in (1, 2, 4, 5) else w for i, w in enumerate(ws)] for ws in layers]
    math_c = LayerMath(HQ, HKV, D, EPS, None).compiled()
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "context": args.context, "fp8": args.fp8, "rows": []}
    for rows in (int(r) for r in args.rows.split(",")):
        backend, rope = case(dev, rows, args.context)
        x = torch.randn(rows, H, device=dev).to(torch.bfloat16)

        def compiled():
            h = x
            for i, (n1, qkv, o, n2, gu, d) in enumerate(layers):
                q, k, v = math_c.attention_inputs(h, n1, qkv, *rope)
                attn = backend(i, q.view(rows, 1, HQ, D), k.view(rows, 1, HKV, D), v.view(rows, 1, HKV, D))
                h = math_c.attention_output_mlp(h, attn.reshape(rows, -1), o, n2, gu, d)
            return h

        def fused(launch=None):  # as PagedAttention.layer runs it (which takes at most pl.MAX_ROWS rows)
            h = x
            for i, w in enumerate(layers):
                h = pl.layer(h, w[0], w[1], *rope, 1, (HQ, HKV, D), *w[2:], EPS, launch=launch,
                             paged=paged(backend, i))
            return h

        def chained(launch=None):  # as `minicpm.MiniCPM` runs them: each layer hands the next its input norm
            h, normed = x, None
            for i, w in enumerate(layers):
                nxt = layers[i + 1][0] if i + 1 < DEPTH else None
                res = pl.layer(h, w[0], w[1], *rope, 1, (HQ, HKV, D), *w[2:], EPS, launch=launch,
                               paged=paged(backend, i), h_in=normed, next_norm=nxt)
                h, normed = res if nxt is not None else (res, None)
            return h

        if rows <= pl.MAX_ROWS:
            assert backend.layer(0, x, 1, rope, (HQ, HKV, D), *layers[0], EPS) is not None, "declined"
        err = (fused().float() - compiled().float()).abs().max().item()
        row = {"rows": rows, "max_abs_diff": err,
               "compiled_us": time_calls([compiled], 1, reps=20) / DEPTH,
               "persistent_us": time_calls([fused], 1, reps=20) / DEPTH,
               "chained_max_abs_diff": (chained().float() - fused().float()).abs().max().item(),
               "chained_us": time_calls([chained], 1, reps=20) / DEPTH}
        row["launch"] = pl.choose_launch(H, HQ * D, I, rows, dev, x.element_size(), fp8=args.fp8)._asdict()
        row["speedup"] = row["compiled_us"] / row["persistent_us"]
        row["chained_speedup"] = row["persistent_us"] / row["chained_us"]
        if rows in sweep_rows:
            row["launches"] = {}
            for name, launch in VARIANTS.items():
                if ONLY and name not in ONLY:
                    continue
                variant = lambda launch=launch: fused(launch)  # noqa: E731
                in_chain = lambda launch=launch: chained(launch)  # noqa: E731
                try:
                    diff = (variant().float() - fused().float()).abs().max().item()
                    chain_diff = (in_chain().float() - fused().float()).abs().max().item()
                    row["launches"][name] = {"us": time_calls([variant], 1, reps=20) / DEPTH, "max_abs_diff": diff,
                                             "chained_us": time_calls([in_chain], 1, reps=20) / DEPTH,
                                             "chained_max_abs_diff": chain_diff}
                except Exception as e:  # out of shared memory and the like
                    row["launches"][name] = {"error": f"{type(e).__name__}: {e}"[:200]}
                print(f"[lm layer] rows {rows:3d} launch {name:22s} {row['launches'][name]}", flush=True)
        # phases, from the global timer (one layer's launch at a time, eagerly)
        times = []
        for rep in range(6):
            bufs = [torch.zeros(160, pl.TIM_COLS, dtype=torch.int64, device=dev) for _ in layers]
            h = x
            for i, (w, buf) in enumerate(zip(layers, bufs)):
                h = pl.layer(h, w[0], w[1], *rope, 1, (HQ, HKV, D), *w[2:], EPS, timings=buf,
                             paged=paged(backend, i))
            torch.cuda.synchronize()
            if rep == 0:
                continue
            times += [pl.phase_times(buf) for buf in bufs]
        merge = len(times[0][0]) == len(PHASES)
        row["profile"] = phase_summary(times, PHASES if merge else [p for p in PHASES if p != "merge splits"])
        res["rows"].append(row)
        print(f"[lm layer] rows {rows:3d}: compiled {row['compiled_us']:6.2f} us, persistent "
              f"{row['persistent_us']:6.2f} us (x{row['speedup']:.2f}), max abs diff {err:.3g}; chained "
              f"{row['chained_us']:6.2f} us (x{row['chained_speedup']:.3f}); profile total {row['profile']['total_us']:.2f} us: "
              + ", ".join(f"{p['phase']} {p['span_us']:.2f}" for p in row["profile"]["phases"]), flush=True)
    res["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
