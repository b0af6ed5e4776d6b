"""Build benchmarks/results.json, results.md and results.png from the raw GPU outputs in benchmarks/raw/.

    .venv/bin/python benchmarks/summarize.py      (needs matplotlib for the plot)

raw/offline.json   scripts/bench.py (engine, CUDA graphs + compiled LocDiT/LocEnc)
raw/served.json    scripts/bench_served.py against tritonserver (tts_stream over gRPC), default config
raw/served_4inst_chunks1248.json  the same with 4 tts_stream instances and chunks of 1,2,4,8 patches
raw/offline_host_fill.json  the engine again after step inputs were built with a few tensor ops (batches 1, 64, 128)
raw/gpu_check.json scripts/gpu_check.py
raw/reference_and_run1.json  voxcpm 2.0.3 eager and optimize(); the engine before compile (run 1)
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    with open(os.path.join(HERE, "raw", name)) as f:
        return json.load(f)


def main():
    off, served, chk, ref = (load(n) for n in ("offline.json", "served.json", "gpu_check.json",
                                               "reference_and_run1.json"))
    eng = off["engine"]["graphs"]
    runs = {r["batch"]: r for r in eng["runs"]}
    levels = {lv["concurrency"]: lv for lv in served["levels"]}
    r = ref["reference"]
    res = {
        "device": off["device"],
        "date": off["date"],
        "steps_per_request": off["steps"],
        "reference_rtf_eager": min(r["eager_rtf"]),
        "reference_rtf_compiled": min(r["compiled_rtf"]),
        "reference_compile_first_call_s": r["compile_first_call_s"],
        "single_stream_rtf_triton": levels[1]["rtf"]["p50"],
        "ttfa_ms_p50": levels[1]["ttfa_ms"]["p50"],
        "ttfa_ms_p95": levels[1]["ttfa_ms"]["p95"],
        "aggregate_xrt_c64": levels[64]["x_real_time"],
        "served": {c: {"ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"],
                       "rtf_p50": lv["rtf"]["p50"], "rtf_p95": lv["rtf"]["p95"],
                       "faster_than_realtime_frac": lv["faster_than_realtime_frac"],
                       "aggregate_xrt": lv["x_real_time"], "errors": lv["errors"]} for c, lv in levels.items()},
        "served_previous_config": {lv["concurrency"]: lv["x_real_time"]
                                   for lv in load("served_4inst_chunks1248.json")["levels"]},
        "engine_offline": {b: {"steps_per_s": x["steps_per_s"], "rtf": x["rtf"], "aggregate_xrt": x["aggregate_xrt"]}
                           for b, x in runs.items()},
        "engine_offline_before_compile": {r_["batch"]: r_["aggregate_xrt"] for r_ in
                                          ref["engine_run1_no_compile"]["graphs"]["runs"]},
        "engine_eager_no_graphs": {r_["batch"]: r_["rtf"] for r_ in ref["engine_run1_no_compile"]["eager"]["runs"]},
        "load_s": off["load_s"],
        "startup_s_compile_and_capture": eng["startup_s"],
        "weights_gib": off["weights_gib"],
        "gpu_mem_peak_gib": eng.get("gpu_mem_peak_gib"),
        "gpu_check": {"bf16_vs_fp32_teacher_forced_cosine_min": chk["teacher_forced"]["cosine_min"],
                      "graph_vs_eager_max_abs": {b: g["max_abs"] for b, g in chk["graph_vs_eager"].items()}},
        "profile_batch1_top_kernels": eng["profile_batch1"][:8],
        "profile_batch128_top_kernels": eng["profile_batch_max"][:8],
    }

    md = [f"# Results: {res['device']}, {res['date']}", "",
          f"Full-size random VoxCPM2 weights (bf16), {res['steps_per_request']} decode steps per request "
          f"(MIN_LENGTH = MAX_LENGTH, 16 s of audio), 10 CFM timesteps, CFG 2.0.", "",
          "| system | single-stream RTF | notes |", "|---|---|---|",
          f"| voxcpm 2.0.3 eager | {res['reference_rtf_eager']:.3f} | |",
          f"| voxcpm 2.0.3 `optimize()` | {res['reference_rtf_compiled']:.3f} | first call compiles for "
          f"{res['reference_compile_first_call_s']:.0f} s |",
          f"| this engine, offline | {runs[1]['rtf']:.3f} | {runs[1]['steps_per_s']:.0f} steps/s |",
          f"| **through Triton** (`tts_stream`, gRPC) | **{res['single_stream_rtf_triton']:.3f}** | "
          f"TTFA p50 {res['ttfa_ms_p50']:.0f} ms |", "",
          "Served (`scripts/bench_served.py`, concurrent gRPC streams on `tts_stream`; default config: 8",
          "tts_stream instances, chunks of 1, 4, then 16 patches):", "",
          "| streams | TTFA p50 / p95 ms | per-stream RTF p50 / p95 | faster than real time | aggregate x real time "
          "| same, 4 instances + chunks 1,2,4,8 |", "|---|---|---|---|---|---|"]
    for c, s in res["served"].items():
        md.append(f"| {c} | {s['ttfa_ms_p50']:.0f} / {s['ttfa_ms_p95']:.0f} | {s['rtf_p50']:.3f} / {s['rtf_p95']:.3f} "
                  f"| {100 * s['faster_than_realtime_frac']:.0f}% | {s['aggregate_xrt']:.1f} "
                  f"| {res['served_previous_config'][c]:.1f} |")
    md += ["", "Engine alone (`scripts/bench.py`, CUDA graphs + compiled LocDiT/LocEnc):", "",
           "| batch | steps/s | RTF | aggregate x real time | before compile (run 1) |", "|---|---|---|---|---|"]
    for b, x in res["engine_offline"].items():
        before = res["engine_offline_before_compile"].get(b)
        md.append(f"| {b} | {x['steps_per_s']:.1f} | {x['rtf']:.3f} | {x['aggregate_xrt']:.1f} | "
                  f"{before:.1f} |" if before else f"| {b} | {x['steps_per_s']:.1f} | {x['rtf']:.3f} | "
                  f"{x['aggregate_xrt']:.1f} | |")
    res["cold_start_compile_capture_s"] = ref.get("cold_start_compile_capture_s")
    latest = load("offline_host_fill.json")
    lg = latest["engine"]["graphs"]
    res["engine_offline_latest"] = {r_["batch"]: {"steps_per_s": r_["steps_per_s"], "aggregate_xrt": r_["aggregate_xrt"]}
                                    for r_ in lg["runs"]}
    res["startup_s_latest_cold"] = latest["load_s"] + lg["startup_s"]
    md += ["", "After building each step's inputs with a few tensor ops instead of a loop per row "
           "(latest engine, same machine type, fresh compile cache):", "",
           "| batch | steps/s | aggregate x real time |", "|---|---|---|"]
    md += [f"| {b} | {x['steps_per_s']:.1f} | {x['aggregate_xrt']:.1f} |" for b, x in res["engine_offline_latest"].items()]
    md += ["", f"That run's cold start (load + compile + capture) took {res['startup_s_latest_cold']:.0f} s."]
    md += ["", f"Start-up: load {res['load_s']:.1f} s, compile + capture of 11 graphs "
           f"{res['startup_s_compile_and_capture']:.0f} s with a warm compile cache, "
           f"{res['cold_start_compile_capture_s']:.0f} s cold; weights {res['weights_gib']:.2f} GiB, peak "
           f"{res['gpu_mem_peak_gib']:.1f} GiB (incl. an 8 GiB KV pool).",
           f"Eager engine without graphs (run 1): RTF {res['engine_eager_no_graphs'].get(1, float('nan')):.2f} at batch 1.",
           "", f"GPU checks: bf16 vs fp32 teacher-forced over 50 steps, patch cosine min "
           f"{res['gpu_check']['bf16_vs_fp32_teacher_forced_cosine_min']:.4f} (>= 0.99); graph replay vs eager, "
           f"max abs {max(res['gpu_check']['graph_vs_eager_max_abs'].values()):.1e} (<= 1e-2).", "",
           "Where a batch-1 step goes (ms of GPU time per step, top kernels):", ""]
    for k in res["profile_batch1_top_kernels"]:
        md.append(f"- {k['cuda_ms_per_step']:.2f} ms  {k['kernel'][:80]}")
    md += ["", "At batch 128:", ""]
    for k in res["profile_batch128_top_kernels"]:
        md.append(f"- {k['cuda_ms_per_step']:.2f} ms  {k['kernel'][:80]}")
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    bs = sorted(res["engine_offline"])
    a.plot(bs, [res["engine_offline"][x]["aggregate_xrt"] for x in bs], "o-", label="engine (graphs + compile)")
    a.plot(sorted(res["engine_offline_before_compile"]),
           [res["engine_offline_before_compile"][x] for x in sorted(res["engine_offline_before_compile"])],
           "s--", label="engine (graphs, run 1)")
    lb = sorted(res["engine_offline_latest"])
    a.plot(lb, [res["engine_offline_latest"][x]["aggregate_xrt"] for x in lb], "D-", label="engine (latest)")
    cs = sorted(res["served"])
    a.plot(cs, [res["served"][c]["aggregate_xrt"] for c in cs], "^-", label="served (tts_stream)")
    a.plot(cs, [res["served_previous_config"][c] for c in cs], "v:", label="served, 4 instances, chunks 1,2,4,8")
    a.set_xscale("log", base=2)
    a.set_xlabel("concurrent requests")
    a.set_ylabel("aggregate x real time")
    a.legend()
    a.grid(alpha=0.3)
    names = ["voxcpm eager", "voxcpm optimize()", "engine offline", "Triton tts_stream"]
    vals = [res["reference_rtf_eager"], res["reference_rtf_compiled"], runs[1]["rtf"], res["single_stream_rtf_triton"]]
    b.bar(names, vals, color=["#999", "#777", "#4a8", "#286"])
    b.set_yscale("log")
    b.set_ylabel("single-stream RTF (lower is better)")
    for i, v in enumerate(vals):
        b.text(i, v, f"{v:.3f}", ha="center", va="bottom")
    b.tick_params(axis="x", rotation=15)
    fig.suptitle(f"VoxCPM2 on {res['device']} ({res['date']})")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "results.png"), dpi=110)
    print("\n".join(md))


if __name__ == "__main__":
    main()
