"""A LocDiT/LocEnc decoder layer of a few tokens, three ways, against the compiled PyTorch path the model
ran before (`LayerMath` around the attention kernel, torch.compile'd), on a CUDA machine:

- the compiled path with inductor's max-autotune (`compiled_torch_autotuned`): its Triton GEMM
  templates where its benchmark finds them faster than cuBLAS (pointwise epilogues fused into them);
- the server's persistent kernel (`voxcpm_triton.kernels.persistent_layer`) and launch variants of it,
  and where its time goes: per phase, from the GPU's global timer in every program;
- the five-kernel experiment (`benchmarks/experiments/five_kernel_layer.py`), with a sweep of launch
  configs for each of its four linears (norm + QKV, output projection + residual, norm + gate/up +
  SiLU product, down + residual) per token count;
- reading weights into L2 ahead of the layers (`benchmarks/experiments/l2_prefetch.py`), on the layers'
  stream or from a second one, and the bound: every layer with the same weights (35 MB: L2 holds them).

Whole layers run 12 in a row (LocDiT's depth, each with its own weights, 420 MB, so the L2 cache does
not hold them):

    python3 benchmarks/kernel_fused_layer.py --out $OUT/kernel_fused_layer.json [--no-sweep] [--profile-only]

Microseconds per call (per layer), median of replays of a CUDA graph of back-to-back calls.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from kernel_skinny_gemm import time_calls  # noqa: E402
from experiments import five_kernel_layer as fl  # noqa: E402  (benchmarks/experiments/)
from experiments import l2_prefetch  # noqa: E402
from voxcpm_triton.kernels import persistent_layer as pl  # noqa: E402
from voxcpm_triton.kernels.fp8 import quantize_weight  # noqa: E402
from voxcpm_triton.kernels.local_attention import local_attention_op  # noqa: E402
from voxcpm_triton.model.minicpm import LayerMath, rms_norm  # noqa: E402

H, HQ, HKV, D, I, EPS = 1024, 16, 2, 128, 4096, 1e-5
DEPTH = 12
# name -> (N, K, kind): the four linears of a layer
LINEARS = {"qkv": ((HQ + 2 * HKV) * D, H, "norm"), "o": (H, HQ * D, "residual"),
           "gate_up": (I, H, "gated"), "down": (H, I, "residual")}
# token counts -> sequence length: LocDiT at batch bucket b is 22 b tokens (2 x 11 with CFG), LocEnc 5 b
TOKENS = {22: 11, 44: 11, 88: 11, 176: 11, 352: 11, 704: 11, 1408: 11, 10: 5, 40: 5, 80: 5, 160: 5, 320: 5}


FP8_WEIGHTS = False  # --fp8: the four projections' weights in e4m3 (`precision` fp8)


def layer_weights(dev, dt, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s, scale: (torch.randn(*s, device=dev, generator=g) * scale).to(dt)  # noqa: E731
    w = dict(n1=(1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(dt),
             qkv=r((HQ + 2 * HKV) * D, H, scale=H ** -0.5), o=r(H, HQ * D, scale=(HQ * D) ** -0.5),
             n2=(1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(dt),
             gate_up=r(2 * I, H, scale=H ** -0.5), down=r(H, I, scale=I ** -0.5))
    if FP8_WEIGHTS:
        w.update({k: quantize_weight(w[k]) for k in ("qkv", "o", "gate_up", "down")})
    return w


def rope(S, dev):
    pos = torch.arange(S, dtype=torch.float32, device=dev)[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32, device=dev) / D))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    return ang.cos(), ang.sin()


MATH = LayerMath(HQ, HKV, D, EPS, None)


def torch_layer(x, w, cos, sin, S):
    """What the model ran before: LayerMath around the attention kernel (compiled by the caller)."""
    qkv = MATH.normed_qkv(x, w["n1"], w["qkv"])
    attn = local_attention_op(qkv, cos, sin, S, HQ, HKV, D)
    return MATH.attention_output_mlp(x, attn, w["o"], w["n2"], w["gate_up"], w["down"])


def fused_layer(x, w, cos, sin, S):
    return fl.layer(x, w["n1"], w["qkv"], cos, sin, S, (HQ, HKV, D), w["o"], w["n2"], w["gate_up"], w["down"], EPS)


def persistent(launch=None):
    def run(x, w, cos, sin, S):
        return pl.layer(x, w["n1"], w["qkv"], cos, sin, S, (HQ, HKV, D), w["o"], w["n2"], w["gate_up"], w["down"],
                        EPS, launch=launch)
    return run


def persistent_chained(layers, x, cos, sin, S):
    """The persistent kernel as `minicpm.MiniCPM` stacks it: each layer hands the next its input norm
    (h_in / next_norm), so every layer but the first skips its norm phase and a barrier."""
    def run():
        h, normed = x, None
        for i, w in enumerate(layers):
            nxt = layers[i + 1]["n1"] if i + 1 < len(layers) else None
            res = pl.layer(h, w["n1"], w["qkv"], cos, sin, S, (HQ, HKV, D), w["o"], w["n2"], w["gate_up"],
                           w["down"], EPS, h_in=normed, next_norm=nxt)
            h, normed = res if nxt is not None else (res, None)
        return h
    return run


def persistent_stack(layers, x, cos, sin, S, **changes):
    """The persistent kernel as `minicpm.MiniCPM` runs LocDiT/LocEnc: all layers in one launch
    (`persistent_layer.stack`), the final norm included (the first layer's weight stands in);
    changes: Launch fields changed from the server's launch."""
    ws = [(w["n1"], w["qkv"], w["o"], w["n2"], w["gate_up"], w["down"]) for w in layers]

    def run():
        launch = None
        if changes:
            launch = pl.choose_launch(H, HQ * D, I, x.size(0), x.device, x.element_size(),
                                      fp8=FP8_WEIGHTS)._replace(**changes)
        return pl.stack(x, ws, layers[0]["n1"], cos, sin, S, (HQ, HKV, D), EPS, launch=launch)[0]
    return run


L = pl.Launch()
L8 = pl.launch_for(H, HQ * D, I, fp8=True)  # the e4m3 launch's tiles (K tiles of FP8_BLOCK_K), nothing else on
PERSISTENT = {  # name -> launch (None: the server's, pl.choose_launch for the sizes, token count and GPU)
    "persistent": None,
    "persistent_stages3": L._replace(stages=3),
    "persistent_stages_all": L._replace(stages=0),
    "persistent_bk256": L._replace(block_k=256),
    "persistent_bk64": L._replace(block_k=64),
    "persistent_qkv16": L._replace(blocks=(16, 32, 32, 32)),
    "persistent_qkv16_o16": L._replace(blocks=(16, 16, 32, 32)),
    "persistent_o64_d64_split8": L._replace(blocks=(32, 64, 32, 64), splits=(8, 8)),
    "persistent_split2_2": L._replace(splits=(2, 2)),
    "persistent_w8": L._replace(num_warps=8),
    "persistent_unswapped": L,  # activation rows as the products' M side (the server's from 64 tokens, or off Hopper)
    "persistent_swap64": L._replace(blocks=(64, 64, 32, 64), splits=(8, 8), swap=True),  # every GEMM phase 64 rows
    "persistent_swap64_s4": L._replace(blocks=(64, 64, 32, 64), swap=True),
    "persistent_gu64": L._replace(blocks=(32, 32, 64, 32), swap=True),
    # swapped (as the server launches under 64 tokens), each program asking L2 for its next GEMM item's first K tiles
    **{f"persistent_pf{n}": L._replace(swap=True, prefetch=n) for n in (1, 2, 4, 8)},
    # with --fp8: e4m3 launches (K tiles of FP8_BLOCK_K) without a prefetch, prefetching, swapped, or both
    "persistent_fp8_plain": L8,
    **{f"persistent_fp8_pf{n}": L8._replace(prefetch=n) for n in (1, 2, 4)},
    "persistent_fp8_swap": L8._replace(swap=True),
    "persistent_fp8_swap_pf2": L8._replace(swap=True, prefetch=2),
}
ONLY: set = set()  # --variants: the layer variants to time (besides compiled_torch, the baseline)


def linear_reference(kind, x, w, norm, res):
    h = rms_norm(x, norm, EPS) if norm is not None else x
    y = F.linear(h, w)
    if kind == "gated":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y + res if res is not None else y


def candidates(kind, N, K):
    for bn, (bk, stages), split in itertools.product((16, 32, 64), ((128, 3), (128, 4), (256, 3)), (1, 2, 4, 8)):
        if (kind == "gated" and split > 1) or K // split < bk:
            continue
        yield fl.Config(bn, bk, split, 4, stages)


def sweep_linears(dev, dt, token_counts):
    rows = []
    for (name, (N, K, kind)), M in itertools.product(LINEARS.items(), token_counts):
        wrows = 2 * N if kind == "gated" else N
        copies = max(2, math.ceil(256e6 / (wrows * K * 2)))
        ws = [torch.randn(wrows, K, device=dev, dtype=dt) * K ** -0.5 for _ in range(copies)]
        x = torch.randn(M, K, device=dev, dtype=dt)
        norm = (1 + 0.1 * torch.randn(K, device=dev)).to(dt) if kind in ("norm", "gated") else None
        res = torch.randn(M, N, device=dev, dtype=dt) if kind == "residual" else None
        want = linear_reference(kind, x, ws[0], norm, res).float()
        tol = 0.02 * max(1.0, want.abs().max().item())
        cublas = time_calls([lambda w=w: linear_reference(kind, x, w, norm, res) for w in ws], copies)
        tried = []
        for cfg in [None, *candidates(kind, N, K)]:
            call = lambda w, cfg=cfg: fl.linear(x, w, norm=norm, eps=EPS, residual=res,  # noqa: E731
                                                gated=kind == "gated", cfg=cfg)
            try:
                err = max((call(ws[0]).float() - want).abs().max().item() for _ in range(3))
                us = time_calls([lambda w=w: call(w) for w in ws], copies)
            except Exception as e:  # resources out of range and the like
                tried.append({"cfg": None if cfg is None else list(cfg), "error": f"{type(e).__name__}: {e}"[:160]})
                continue
            tried.append({"cfg": list(cfg or fl.config(M, N, K, kind == "gated")), "default": cfg is None,
                          "us": us, "max_err": err, "wrong": err > tol})
        ok = sorted((t for t in tried if "us" in t and not t["wrong"]), key=lambda t: t["us"])
        row = {"linear": name, "M": M, "N": N, "K": K, "kind": kind, "weight_mb": wrows * K * 2 / 1e6,
               "eager_torch_us": cublas, "default": next((t for t in tried if t.get("default")), None),
               "best": ok[0] if ok else None, "top": ok[:5], "tried": len(tried),
               "wrong": sum(bool(t.get("wrong")) for t in tried), "errors": sum("error" in t for t in tried)}
        rows.append(row)
        b = row["best"]
        print(f"{name:8s} M={M:3d} eager {cublas:6.2f} us  default {row['default'].get('us', float('nan')):6.2f}"
              f"  best {b['us'] if b else float('nan'):6.2f} {b['cfg'] if b else None}  wrong {row['wrong']}", flush=True)
    return rows


def time_layers(dev, dt, token_counts, tuned):
    layers = [layer_weights(dev, dt, seed) for seed in range(DEPTH)]
    out = []
    for M in token_counts:
        S = TOKENS[M]
        cos, sin = rope(S, dev)
        x = torch.randn(M, H, device=dev, dtype=dt)
        compiled = torch.compile(torch_layer, dynamic=False)
        # inductor's own Triton GEMM templates where its benchmark finds them faster than cuBLAS, with
        # pointwise epilogues fused into them
        autotuned = torch.compile(torch_layer, dynamic=False, mode="max-autotune-no-cudagraphs")

        side = torch.cuda.Stream()

        def stack(layer_fn, prefetch=None, resident=False, programs=32):
            """prefetch: before each layer, read into L2 "rest" (its own o, gate/up and down weights and
            the next layer's QKV) or "next" (the next layer's four), on the layers' stream; "side": "rest"
            from a second stream. resident: every layer with the first one's weights (35 MB: L2 holds them)."""
            stack_layers = [layers[0]] * len(layers) if resident else layers

            def run():
                h = x
                for i, w in enumerate(stack_layers):
                    nxt = stack_layers[(i + 1) % len(stack_layers)]
                    if prefetch == "rest":
                        l2_prefetch.prefetch([w["o"], w["gate_up"], w["down"], nxt["qkv"]], programs)
                    elif prefetch == "next":
                        l2_prefetch.prefetch([nxt["qkv"], nxt["o"], nxt["gate_up"], nxt["down"]], programs)
                    elif prefetch == "side":
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            l2_prefetch.prefetch([w["o"], w["gate_up"], w["down"], nxt["qkv"]], programs)
                    h = layer_fn(h, w, cos, sin, S)
                if prefetch == "side":
                    torch.cuda.current_stream().wait_stream(side)
                return h
            return run

        want = stack(torch_layer)().float()
        row = {"M": M, "seq_len": S}
        variants = {"compiled_torch": stack(compiled), "compiled_torch_autotuned": stack(autotuned),
                    "fused_default": stack(fused_layer),
                    "compiled_torch_prefetch_rest": stack(compiled, "rest"),
                    "compiled_torch_prefetch_next": stack(compiled, "next"),
                    "compiled_torch_prefetch_side4": stack(compiled, "side", programs=4),
                    "compiled_torch_l2_resident": stack(compiled, resident=True),
                    "fused_l2_resident": stack(fused_layer, resident=True),
                    "fused_prefetch_rest": stack(fused_layer, "rest"),
                    "fused_prefetch_side4": stack(fused_layer, "side", programs=4),
                    **{name: stack(persistent(launch)) for name, launch in PERSISTENT.items()},
                    "persistent_l2_resident": stack(persistent(), resident=True),
                    "persistent_chained": persistent_chained(layers, x, cos, sin, S),
                    "persistent_stack": persistent_stack(layers, x, cos, sin, S),
                    "persistent_stack_pf0": persistent_stack(layers, x, cos, sin, S, prefetch=0),
                    # deeper pipelines: as many stages as K tiles (and shared memory) allow, or K tiles of 256
                    "persistent_stack_stages_all": persistent_stack(layers, x, cos, sin, S, stages=0),
                    "persistent_stack_bk256": persistent_stack(layers, x, cos, sin, S, block_k=256),
                    # every gate/up item a whole tile (Launch.balance off): the same launch where the
                    # 128 tiles cover the programs (H100/H200), a check that balance changes nothing there
                    "persistent_stack_unbalanced": persistent_stack(layers, x, cos, sin, S, balance=False)}
        if tuned:
            variants["fused_tuned"] = stack(fused_layer)
        if ONLY:
            variants = {k: v for k, v in variants.items() if k in ONLY or k == "compiled_torch"}
        for name, run in variants.items():
            saved = dict(fl.TUNED)
            if not name.startswith("fused") or name == "fused_default":
                fl.TUNED.clear()
            else:
                fl.TUNED.update(tuned)
            try:
                err = (run().float() - want).abs().max().item()
                us = time_calls([run], 1, reps=25) / DEPTH
                row[name] = {"us_per_layer": us, "max_err_vs_eager": err}
            except Exception as e:  # a launch out of resources and the like
                row[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            finally:
                fl.TUNED.clear()
                fl.TUNED.update(saved)
        base = row["compiled_torch"]["us_per_layer"]
        for name in variants:
            if "us_per_layer" in row[name]:
                row[name]["speedup"] = base / row[name]["us_per_layer"]
        for k, v in row.items():
            if isinstance(v, dict):
                print(f"layer M={M:3d} {k:32s} " + (f"{v['us_per_layer']:6.2f} us  x{v['speedup']:.2f}  err "
                      f"{v['max_err_vs_eager']:.3g}" if "us_per_layer" in v else v["error"]), flush=True)
        out.append(row)
    # the prefetch kernel alone, over one layer's weights (16-bit ones)
    for programs in () if FP8_WEIGHTS else (4, 32, 132):
        us = time_calls([lambda w=w: l2_prefetch.prefetch([w["qkv"], w["o"], w["gate_up"], w["down"]], programs)
                         for w in layers], len(layers))
        print(f"prefetch of one layer (35 MB), {programs} programs: {us:.2f} us", flush=True)
        out.append({"prefetch_alone_programs": programs, "us": us})
    return out


PHASE_NAMES = ["norm", "qkv", "attention", "o (split K)", "sum+residual+norm", "gate/up+silu", "down (split K)",
               "sum+residual"]


def phase_summary(times: list, names: list) -> dict:
    """`persistent_layer.phase_times` of many launches -> medians: total_us, and per phase (names) its
    span_us and its barrier's barrier_us (None after the last phase)."""
    med = statistics.median
    spans, waits, totals = zip(*times)
    assert all(len(s) == len(names) for s in spans), (len(spans[0]), names)
    return {"total_us": med(totals),
            "phases": [{"phase": n, "span_us": med(s[k] for s in spans),
                        "barrier_us": med(w[k] for w in waits) if k < len(names) - 1 else None}
                       for k, n in enumerate(names)]}


def phase_profile(dev, dt, M, launch=None):
    """Where a persistent layer's time goes: per phase, from the GPU's global timer in every program
    (`persistent_layer.layer(timings=)`), median over 12 layers x 5 runs: the phase's span (the
    previous barrier's first exit to this barrier's last arrival) and the barrier's own wait (its last
    arrival to its last exit)."""
    layers = [layer_weights(dev, dt, seed) for seed in range(DEPTH)]
    S = TOKENS[M]
    cos, sin = rope(S, dev)
    x = torch.randn(M, H, device=dev, dtype=dt)
    times = []
    for rep in range(6):
        bufs = [torch.zeros(160, pl.TIM_COLS, dtype=torch.int64, device=dev) for _ in layers]
        h = x
        for w, buf in zip(layers, bufs):
            h = pl.layer(h, w["n1"], w["qkv"], cos, sin, S, (HQ, HKV, D), w["o"], w["n2"], w["gate_up"], w["down"],
                         EPS, launch=launch, timings=buf)
        torch.cuda.synchronize()
        if rep == 0:
            continue  # compiles
        times += [pl.phase_times(buf) for buf in bufs]
    launch = launch or pl.choose_launch(H, HQ * D, I, M, dev, x.element_size(), fp8=FP8_WEIGHTS)
    res = {"M": M, "launch": launch._asdict(), **phase_summary(times, PHASE_NAMES)}
    print(f"persistent M={M} {res['launch']}: total {res['total_us']:.2f} us (start of first program to end of last)", flush=True)
    for p in res["phases"]:
        print(f"   {p['phase']:15s} span {p['span_us']:6.2f} us  barrier {p['barrier_us'] or 0:5.2f} us", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="kernel_fused_layer.json")
    ap.add_argument("--tokens", default="44,22,10", help="token counts of the whole layers (of TOKENS)")
    ap.add_argument("--sweep-tokens", default="44,10", help="token counts of the linears' sweep")
    ap.add_argument("--no-sweep", action="store_true", help="whole layers only, with the checked-in table")
    ap.add_argument("--profile-only", action="store_true", help="only the persistent layer's phase profile")
    ap.add_argument("--max-tokens", type=int, default=pl.MAX_TOKENS,
                    help="the persistent layer's token bound for this run (past the server's: what more would give)")
    ap.add_argument("--variants", default="", help="only these layer variants (names, comma-separated)")
    ap.add_argument("--profile-launch", default="",
                    help="the phase profile with these PERSISTENT launches too (comma-separated)")
    ap.add_argument("--fp8", action="store_true",
                    help="e4m3 projection weights (with --no-sweep and --variants of persistent launches)")
    args = ap.parse_args()
    global FP8_WEIGHTS
    FP8_WEIGHTS = args.fp8
    pl.MAX_TOKENS = args.max_tokens
    ONLY.update(v for v in args.variants.split(",") if v)
    dev, dt = torch.device("cuda"), torch.bfloat16
    tokens = [int(t) for t in args.tokens.split(",")]
    t0 = time.time()
    fits = [M for M in tokens if M <= pl.MAX_TOKENS]  # the persistent layer's phases: under its bound only
    profiles = [phase_profile(dev, dt, M) for M in fits]
    if args.profile_launch:
        profiles += [phase_profile(dev, dt, M, PERSISTENT[name]) for name in args.profile_launch.split(",")
                     for M in fits]
    if args.profile_only:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "fp8": args.fp8,
                       "persistent_profiles": profiles}, f, indent=1)
        return
    rows = [] if args.no_sweep else sweep_linears(dev, dt, [int(t) for t in args.sweep_tokens.split(",")])
    tuned = {(r["N"], r["K"], r["kind"] == "gated", max(16, fl._next_pow2(r["M"]))): fl.Config(*r["best"]["cfg"])
             for r in rows if r["best"]}
    layers = time_layers(dev, dt, tokens, tuned if rows else dict(fl.TUNED))
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "fp8": args.fp8, "seconds": round(time.time() - t0, 1), "linears": rows, "layers": layers,
           "persistent_profiles": profiles,
           "tuned": [[list(k), list(v)] for k, v in tuned.items()],
           # the five-kernel experiment's; it fails past 64 tokens (those rows hold its error)
           "layer_median_speedup": statistics.median(
               [v["speedup"] for r in layers if "M" in r for v in [r.get("fused_tuned", r.get("fused_default", {}))]
                if "speedup" in v] or [float("nan")])}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {args.out} after {res['seconds']} s")


if __name__ == "__main__":
    main()
