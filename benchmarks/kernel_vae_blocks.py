#!/usr/bin/env python3
"""Launch shapes of the VAE decoder's elementwise Triton kernels (`kernels.vae`: dwconv_snake,
snake_extend, skip_add), on a CUDA machine: each (BLOCK_C, BLOCK_T, num_warps) timed on every
residual unit of the full-size decoder for B streams x n patches (one served call), summed.

    python3 benchmarks/kernel_vae_blocks.py --streams 64 --patches 4 --out $OUT/vae_blocks.json

With --unit, the rest of each residual unit after its first snake instead: the three kernels the
decoder ran (dwconv_snake, cuDNN's pointwise conv, skip_add) against `unit_tail` at its defaults and
at every launch (BLOCK_CO, BLOCK_CI, BLOCK_T, warps, fp32 product precision), us per unit, each with
its largest difference from the three kernels with TF32 off (exact fp32).

With --bandwidth, how near memory bandwidth each residual unit's kernels run at their default launches
(fp32, B streams x n patches): each kernel's time against the bytes it must move at least (its
[B, C, T] inputs read once, its output written once; the look-back frames and weights not counted)
and against a copy of as many bytes (`Tensor.copy_`, what the GPU's memory reaches in practice); and
the unit's kernels together against one copy of x (what one kernel for the whole unit would move at
least, its look-back aside: x read once, the output written once). Each unit also as it runs with
the first snake applied to the taps as they load (`*_on_load`, `kernels.vae.residual_unit`), and the
units of `kernels.vae.UNIT_CL_CHANNELS` channels-last (`snake_extend_cl` and `unit_cl`, as served).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def unit_shapes(streams, patches, rates=(8, 6, 5, 2, 2, 2), dim=2048, frames_per_patch=4, dilations=(1, 3, 9)):
    """(C, T, dilation) of each depthwise residual unit, in decoder order (other `dilations`: the same
    shapes with taps the decoder does not have, e.g. 8: every tap and row 16-byte aligned)."""
    T, out = frames_per_patch * patches, []
    for level, stride in enumerate(rates):
        T *= stride
        out += [(dim // 2 ** (level + 1), T, d) for d in dilations]
    return out


def time_config(shapes, B, dtype, block_c, block_t, warps, kernels):
    from triton.testing import do_bench

    vae_kernels.BLOCK_C, vae_kernels.BLOCK_T, vae_kernels.NUM_WARPS = block_c, block_t, warps
    total = {k: 0.0 for k in kernels}
    for C, T, d in shapes:
        x = torch.randn(B, C, T, device="cuda", dtype=dtype)
        prev = torch.randn(B, C, 6 * d, device="cuda", dtype=dtype)
        w, bias = torch.randn(C, 1, 7, device="cuda", dtype=dtype), torch.randn(C, device="cuda", dtype=dtype)
        alpha = torch.rand(C, device="cuda", dtype=dtype) + 0.5
        xp, _ = vae_kernels.snake_extend(prev, x, alpha)
        calls = {"snake_extend": lambda: vae_kernels.snake_extend(prev, x, alpha),
                 "dwconv_snake": lambda: vae_kernels.dwconv_snake(xp, w, bias, alpha, d),
                 "skip_add": lambda: vae_kernels.skip_add(x, x, bias)}
        for k in kernels:
            total[k] += do_bench(calls[k], warmup=3, rep=10) * 1e3
    return total


def _set_unit_launch(launch):
    """launch: (BLOCK_CO, BLOCK_CI, BLOCK_T, warps, dot precision) for every width, or None: the defaults."""
    vae_kernels.UNIT_BLOCK_CO, vae_kernels.UNIT_LAUNCHES, vae_kernels.UNIT_DOT_PRECISION = _UNIT_DEFAULTS
    if launch is not None:
        co, ci, t, warps, precision = launch
        vae_kernels.UNIT_BLOCK_CO, vae_kernels.UNIT_LAUNCHES = co, {1 << 30: (ci, t, warps)}
        vae_kernels.UNIT_DOT_PRECISION = precision


_UNIT_DEFAULTS = (vae_kernels.UNIT_BLOCK_CO, dict(vae_kernels.UNIT_LAUNCHES), vae_kernels.UNIT_DOT_PRECISION)


def unit_sweep(shapes, B, dtype, launches, max_channels):
    """[{"C", "T", "dilation", "three_kernels": us, str(launch): (us, max abs diff)}] for each residual
    unit of up to max_channels; launch None is the module's defaults."""
    from triton.testing import do_bench

    rows = []
    for C, T, d in shapes:
        if C > max_channels:
            continue
        g = lambda *shape: torch.randn(*shape, device="cuda").to(dtype)  # noqa: E731
        x, xp = g(B, C, T), g(B, C, T + 6 * d)
        w, bias, alpha = g(C, 1, 7) / 3, g(C), (torch.rand(C, device="cuda") + 0.5).to(dtype)
        pw, pb = g(C, C, 1) / C ** 0.5, g(C)

        def three():
            y = vae_kernels.dwconv_snake(xp, w, bias, alpha, d)
            return vae_kernels.skip_add(x, torch.nn.functional.conv1d(y, pw), pb)

        with torch.backends.cudnn.flags(allow_tf32=False):
            exact = three().float()
        want = three()
        row = {"C": C, "T": T, "dilation": d, "three_kernels": do_bench(three, warmup=3, rep=20) * 1e3,
               "three_kernels_diff_vs_exact": (want.float() - exact).abs().max().item()}
        for launch in launches:
            _set_unit_launch(launch)
            call = lambda: vae_kernels.unit_tail(xp, x, w, bias, alpha, pw, pb, d)  # noqa: E731
            try:
                diff = (call().float() - exact).abs().max().item()
                row[str(launch)] = (do_bench(call, warmup=3, rep=20) * 1e3, diff)
            except Exception as e:  # noqa: BLE001 - a launch past the SM's shared memory or registers
                row[str(launch)] = (float("inf"), repr(e)[:80])
        _set_unit_launch(None)
        best = min(launches, key=lambda k: row[str(k)][0])
        print(f"C {C:4d} T {T:5d} d {d}: three kernels {row['three_kernels']:7.1f} us (vs exact "
              f"{row['three_kernels_diff_vs_exact']:.1e}), unit_tail default {row['None'][0]:7.1f} "
              f"({row['None'][1]:.1e}), best {row[str(best)][0]:7.1f} at {best} ({row[str(best)][1]:.1e})", flush=True)
        rows.append(row)
    return rows


def parse_settings(spec: str) -> dict:
    """'NAME=VALUE+NAME=VALUE' -> {kernels.vae constant: value} ('' -> {})."""
    import ast

    settings = {}
    for item in (i for i in spec.split("+") if i):
        name, value = item.split("=", 1)
        if not hasattr(vae_kernels, name):
            raise SystemExit(f"kernels.vae has no {name!r} (a variant's NAME=VALUE)")
        try:
            settings[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[name] = value  # a plain string, e.g. tf32
    return settings


def parse_variants(spec: str) -> dict:
    """'NAME=VALUE+NAME=VALUE;...' -> {spec of one variant: parse_settings of it} (--unit-variants)."""
    return {variant: parse_settings(variant) for variant in spec.split(";") if variant}


def bandwidth_rows(shapes, B, variants=None, row_align: str = "served") -> list:
    """[{"C", "T", "dilation", "copy_us", kernel: {"us", "gb", "gb_per_s", "of_copy"}, "unit_us"}]
    for every residual unit at the default launches (--bandwidth); with `variants` (parse_variants),
    also "unit_tail[<variant>]", "unit_tail_on_load[<variant>]" and "dwconv_snake_on_load[<variant>]" per
    variant, each with its largest difference from the default's output."""
    from triton.testing import do_bench

    rows = []
    for C, T, d in shapes:
        g = lambda *shape: torch.randn(*shape, device="cuda")  # noqa: E731
        x, prev = g(B, C, T), g(B, C, 6 * d)
        w, bias, alpha = g(C, 1, 7) / 3, g(C), torch.rand(C, device="cuda") + 0.5
        pw, pb = g(C, C, 1) / C ** 0.5, g(C)
        align = vae_kernels.unit_row_align(C) if row_align == "served" else int(row_align)
        xp, _ = vae_kernels.snake_extend(prev, x, alpha, row_align=align)
        n = x.numel() * 4  # bytes of one [B, C, T] fp32 tensor
        calls = {"snake_extend": (lambda: vae_kernels.snake_extend(prev, x, alpha, row_align=align), 2 * n)}
        # the first snake applied to the taps as they load (`residual_unit`): no look-back pass
        on_load = dict(prev=prev, pre_alpha=alpha)
        if C <= vae_kernels.UNIT_MAX_CHANNELS:
            calls["unit_tail"] = (lambda: vae_kernels.unit_tail(xp, x, w, bias, alpha, pw, pb, d), 3 * n)
            calls["unit_tail_on_load"] = (lambda: vae_kernels.unit_tail(None, x, w, bias, alpha, pw, pb, d, **on_load),
                                          2 * n)
            on_load_keys = ["unit_tail_on_load"]
        else:
            calls["dwconv_snake_on_load"] = (lambda: vae_kernels.dwconv_snake(x, w, bias, alpha, d, **on_load), 2 * n)
            on_load_keys = ["dwconv_snake_on_load", "pointwise_conv", "skip_add"]
            y = vae_kernels.dwconv_snake(xp, w, bias, alpha, d)
            calls["dwconv_snake"] = (lambda: vae_kernels.dwconv_snake(xp, w, bias, alpha, d), 2 * n)
            calls["pointwise_conv"] = (lambda: torch.nn.functional.conv1d(y, pw), 2 * n)
            z = torch.nn.functional.conv1d(y, pw)
            calls["skip_add"] = (lambda: vae_kernels.skip_add(x, z, pb), 3 * n)
        cl_keys = []
        if vae_kernels.unit_channels_last(C):  # as served: channels-last x, its look-back pass, `unit_cl`
            x_cl = x.transpose(1, 2).contiguous().transpose(1, 2)
            xp_cl, _ = vae_kernels.snake_extend(prev, x_cl, alpha, channels_last=True)
            calls["snake_extend_cl"] = (lambda: vae_kernels.snake_extend(prev, x_cl, alpha, channels_last=True), 2 * n)
            calls["unit_cl"] = (lambda: vae_kernels.unit_cl(xp_cl, x_cl, w, bias, alpha, pw, pb, d), 3 * n)
            cl_keys = ["snake_extend_cl", "unit_cl"]
        out = torch.empty_like(x)
        copy_us = do_bench(lambda: out.copy_(x), warmup=3, rep=20) * 1e3
        row = {"C": C, "T": T, "dilation": d, "copy_us": copy_us, "copy_gb_per_s": 2 * n / copy_us / 1e3}
        for k, (fn, nbytes) in calls.items():
            us = do_bench(fn, warmup=3, rep=20) * 1e3
            row[k] = {"us": us, "gb": nbytes / 1e9, "gb_per_s": nbytes / us / 1e3,
                      "of_copy": nbytes / us / 1e3 / row["copy_gb_per_s"]}
        row["unit_on_load_us"] = sum(row[k]["us"] for k in on_load_keys)
        row["unit_us"] = sum(row[k]["us"] for k in calls if not k.endswith("_on_load") and k not in cl_keys)
        if cl_keys:
            row["unit_cl_us"] = sum(row[k]["us"] for k in cl_keys)
        print(f"C {C:4d} T {T:6d} d {d}: copy {copy_us:7.1f} us ({row['copy_gb_per_s']:.0f} GB/s); "
              + ", ".join(f"{k} {row[k]['us']:7.1f} us ({100 * row[k]['of_copy']:.0f}% of the copy's GB/s)" for k in calls)
              + f"; the unit {row['unit_us']:.1f} us (snake on load {row['unit_on_load_us']:.1f}"
              + (f", channels-last {row['unit_cl_us']:.1f}" if cl_keys else "") + f") against one copy {copy_us:.1f}",
              flush=True)
        for kernel in ("unit_tail", "unit_tail_on_load", "dwconv_snake_on_load", "unit_cl"):
            if kernel not in calls or not variants:
                continue
            fn, nbytes = calls[kernel]
            output = (lambda: fn()[0]) if kernel.endswith("_on_load") else fn  # (out, tail) on load
            want = output()
            for name, settings in variants.items():
                saved = {k: getattr(vae_kernels, k) for k in settings}
                for k, v in settings.items():
                    setattr(vae_kernels, k, v)
                try:
                    us = do_bench(fn, warmup=3, rep=20) * 1e3
                    row[f"{kernel}[{name}]"] = {"us": us, "of_copy": nbytes / us / 1e3 / row["copy_gb_per_s"],
                                                "max_abs_vs_default": (output() - want).abs().max().item()}
                except Exception as e:  # noqa: BLE001 - a launch past the SM's resources: recorded
                    row[f"{kernel}[{name}]"] = {"error": repr(e)[:200]}
                finally:
                    for k, v in saved.items():
                        setattr(vae_kernels, k, v)
                print(f"    {kernel}[{name}]: {json.dumps(row[f'{kernel}[{name}]'])}", flush=True)
        rows.append(row)
        del x, prev, xp, out
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--patches", type=int, default=4)
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--block-c", default="1,2,4,8,16")
    ap.add_argument("--block-t", default="256,512,1024,2048")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--out", default="vae_blocks.json")
    ap.add_argument("--unit", action="store_true", help="time unit_tail against the three kernels it replaces")
    ap.add_argument("--block-co", default="32,64,128,256")
    ap.add_argument("--block-ci", default="16,32,64")
    ap.add_argument("--unit-block-t", default="32,64,128")
    ap.add_argument("--dot-precision", default=vae_kernels.UNIT_DOT_PRECISION,
                    help="fp32 products to try, e.g. tf32,tf32x3,ieee (default: the kernel's)")
    ap.add_argument("--max-channels", type=int, default=4096, help="--unit: the widest unit timed")
    ap.add_argument("--bandwidth", action="store_true", help="each unit's kernels against memory bandwidth")
    ap.add_argument("--dilations", default="1,3,9", help="the units' dilations (the decoder's: 1,3,9)")
    ap.add_argument("--row-align", default="served", help="--bandwidth: snake_extend's row_align (its output, "
                    "the depthwise kernels' input): 'served' (kernels.vae.unit_row_align, the decoder's; before the "
                    "thirty-second session the default was 1) or a number, e.g. 1 or 16")
    ap.add_argument("--unit-variants", default="", help="--bandwidth: unit_tail (and the on-load kernels and unit_cl) again with kernels.vae constants "
                    "set, e.g. 'UNIT_DOT_PRECISION=tf32;UNIT_BLOCK_CO=64+UNIT_DOT_PRECISION=tf32' (';' between variants, "
                    "'+' within one)")
    args = ap.parse_args()
    shapes = unit_shapes(args.streams, args.patches, dilations=tuple(int(d) for d in args.dilations.split(",")))
    if args.bandwidth:
        rows = bandwidth_rows(shapes, args.streams, parse_variants(args.unit_variants), args.row_align)
        # copy_us: what one pass per unit needs
        total = {k: sum(r[k] for r in rows) for k in ("unit_us", "unit_on_load_us", "copy_us")}
        print(f"all units: {total['unit_us']:.0f} us (snake on load {total['unit_on_load_us']:.0f}), one copy per "
              f"unit {total['copy_us']:.0f} us", flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "streams": args.streams, "patches": args.patches,
                       "row_align": args.row_align, "units": rows, "total_us": total}, f, indent=1)
        return
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    if args.unit:
        launches = [None] + list(itertools.product(ints(args.block_co), ints(args.block_ci), ints(args.unit_block_t),
                                                   ints(args.warps), args.dot_precision.split(",")))
        out = {"device": torch.cuda.get_device_name(), "streams": args.streams, "patches": args.patches,
               "defaults": repr(_UNIT_DEFAULTS), "units": {}}
        for dt in args.dtypes.split(","):
            out["units"][dt] = unit_sweep(shapes, args.streams, DTYPES[dt], launches, args.max_channels)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        return
    default = (vae_kernels.BLOCK_C, vae_kernels.BLOCK_T, vae_kernels.NUM_WARPS)
    kernels = ("snake_extend", "dwconv_snake", "skip_add")
    out = {"device": torch.cuda.get_device_name(), "streams": args.streams, "patches": args.patches,
           "default": default, "rows": []}
    for dt in args.dtypes.split(","):
        best = {}
        for bc, bt, nw in itertools.product(ints(args.block_c), ints(args.block_t), ints(args.warps)):
            us = time_config(shapes, args.streams, DTYPES[dt], bc, bt, nw, kernels)
            out["rows"].append({"dtype": dt, "block_c": bc, "block_t": bt, "warps": nw, **us})
            for k in kernels:
                if k not in best or us[k] < best[k][0]:
                    best[k] = (us[k], (bc, bt, nw))
            tag = " (default)" if (bc, bt, nw) == default else ""
            print(f"[{dt}] BLOCK_C {bc:2d} BLOCK_T {bt:4d} warps {nw}: "
                  + ", ".join(f"{k} {v:7.1f} us" for k, v in us.items()) + tag, flush=True)
        print(f"[{dt}] best: " + ", ".join(f"{k} {v[0]:.1f} us at {v[1]}" for k, v in best.items()), flush=True)
        out[f"best_{dt}"] = {k: {"us": v[0], "config": v[1]} for k, v in best.items()}
    vae_kernels.BLOCK_C, vae_kernels.BLOCK_T, vae_kernels.NUM_WARPS = default
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
