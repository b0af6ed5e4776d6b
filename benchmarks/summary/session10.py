"""results.md: the tenth session's section, and results_tenth.png."""

from kernel_kinds import KERNEL_KINDS
from summary.plots import plot_playback
from summary.raw import load, served_cell, served_levels


def tenth_session(res) -> list[str]:
    """2026-11-25, second session: schedule-sized early chunks, no compile in a first burst, FP8
    served, the batch-1 profile kernel by kernel. Sets the final served keys of `res`."""
    burst, poisson = served_levels("served_tenth_final.json"), served_levels("served_tenth_final_poisson.json")
    before, before_p = served_levels("served_tenth_before_fixes.json"), served_levels("served_tenth_before_fixes_poisson.json")
    cap = {"burst": load("served_tenth_final.json")["capacity"],
           "poisson": load("served_tenth_final_poisson.json")["capacity"]}
    fp8 = served_levels("served_fp8.json")[1]
    res.update({"ttfa_ms_p95_c64": burst[64]["ttfa_ms"]["p95"], "smooth_frac_c64": burst[64]["smooth_playback_frac"],
                "aggregate_xrt_c64": burst[64]["x_real_time"], "aggregate_xrt_c128": burst[128]["x_real_time"],
                "capacity_streams": cap, "single_stream_rtf_triton": burst[1]["rtf"]["p50"],
                "ttfa_ms_p50": burst[1]["ttfa_ms"]["p50"], "ttfa_ms_p95": burst[1]["ttfa_ms"]["p95"],
                "single_stream_rtf_triton_fp8": fp8["rtf"]["p50"],
                "ttfa_ms_p50_fp8": fp8["ttfa_ms"]["p50"]})
    md = ["", "## Tenth session (2026-11-25, H100): early chunks, a first burst without a compile, FP8 served", "",
          "Early chunks, one call, four servers in turn (A, B, A, B; burst arrivals; smooth / x real time / TTFA p95 "
          "ms). A: the ninth session's committed policy, every pending patch at once; B: the largest "
          "`chunk_schedule` size the pending patches fill, the rest with the next chunk "
          "(`raw/served_early_chunks_*.json`):", "", "| server | 64 streams | 128 streams |", "|---|---|---|"]
    for v in ("A1", "B1", "A2", "B2"):
        lv = served_levels(f"served_early_chunks_{v}.json")
        md.append(f"| {v} | {served_cell(lv[64])} | {served_cell(lv[128])} |")
    md += ["", "Lengths off the schedule have no VAE graph of their own and decode as several graph-sized "
           "replays, which the VAE, busy 50-90% at these loads, cannot spare. B is the default now, with one "
           "addition after review that the A/B did not include: a client that has already run dry gets every "
           "pending patch (B alone could hold 2 of them back for the rest of an overloaded stream; "
           "tests/test_scheduler.py).", "",
           "The first burst: the 8-stream level stalled 0.5-0.8 s on every fresh server. `startup_check.py "
           "--bursts 2,1,1,7,7,16` (waves of requests after start-up) reproduced it offline: the first wave of 7 "
           "waited 668 ms with the ninth session's warm-up, 510 ms with a wider one (`raw/startup_bursts_before.json`: "
           "the wave compiled `_paged_decode_kernel`). Seven copies of one prompt share its cached prefix, so they "
           "prefill as rows of the paged decode kernel, whose block-table width (an integer argument Triton "
           "specializes on: == 1, divisible by 16, other) was new. The kernel no longer specializes on it, those "
           "rows take one split, and the warm-up prefills packs of 1-3 prompts both ways: the wave of 7 now takes "
           "98 ms and compiles nothing, warm-up 0.35 s (`raw/startup_bursts_after.json`).", "",
           "tritonserver logged `Cannot remove future from background` 42 times in one served run "
           "(triton-inference-server/server#8537: an async execute that finishes before the stub registers it); "
           "`tts_stream`'s execute now awaits its streams, and the next runs logged none.", "",
           "`gpu_check.py` passes every check on the final code (`raw/gpu_check.json`). Its VAE replay-vs-eager "
           "check had failed since chunks without a graph of their own replay graph-sized pieces (3.3e-4 against "
           "a 1e-4 bound for identical kernels): it now decodes such a chunk in the same pieces on both sides "
           "(0.0).", "",
           "Served on the final code, a fresh machine, `ARRIVALS=burst,poisson LEVELS=1,8,32,64,96,128 bash "
           "benchmarks/run_served_gpu.sh` (`raw/served_tenth_final*.json`), next to the same run before these "
           "changes (`raw/served_tenth_before_fixes*.json`); smooth / x real time / TTFA p95 ms:", "",
           "| streams | burst, before | burst, now | Poisson, before | Poisson, now |", "|---|---|---|---|---|"]
    for c in sorted(burst):
        md.append(f"| {c} | {served_cell(before[c])} | {served_cell(burst[c])} | {served_cell(before_p[c])} | {served_cell(poisson[c])} |")
    md += ["", f"Capacity: burst {cap['burst']} (was 1), Poisson {cap['poisson']} (was 32). Above 64 streams "
           "the rest wait for a decoder row (`max_batch_size` 64): TTFA p95 passes 2 s at 128.", "",
           f"FP8 served (`precision` fp8, one stream, `raw/served_fp8.json`): RTF {fp8['rtf']['p50']:.3f}, TTFA "
           f"p50 {fp8['ttfa_ms']['p50']:.1f} ms, against {burst[1]['rtf']['p50']:.3f} and "
           f"{burst[1]['ttfa_ms']['p50']:.1f} ms in bf16: at one row the per-token activation scaling and "
           "`_scaled_mm` cost more than the halved weight reads save.", ""]
    prof = load("offline_profile_tenth.json")["engine"]["graphs"]["profile_batch1"]
    kinds = dict(KERNEL_KINDS)
    other = [k for k in prof["all"] if not any(f in k["kernel"] for frags in kinds.values() for f in frags)]
    md += [f"Batch 1, kernel by kernel (`bench.py --batches 1,64 --graphs-only`, `raw/offline_profile_tenth.json`): "
           f"{prof['gpu_ms']:.2f} ms of GPU work in {prof['kernels']:.0f} kernels, {prof['wall_ms_per_step']:.2f} ms "
           "per step. GEMMs " + f"{prof['by_kind_ms']['GEMM (cuBLAS)']:.2f} ms move about 7.5 GB of weights "
           "(LocDiT's 0.42 GB nine times is half of it), 1.6 TB/s; at the H100's 3.35 TB/s they alone would take "
           "2.2 ms, so a 4 ms step needs nearly every other kernel and gap gone as well. 'Other' holds, per step:", ""]
    md += [f"- {k['cuda_ms']:.3f} ms, {k['calls']:.0f} calls: {k['kernel'][:70]}" for k in other[:6]]
    md += ["", "(index_put: the two LMs' K/V cache writes, outside the compiled layer halves.) "
           "`bench.py --max-autotune` (inductor autotuning its GEMMs, Triton templates against "
           "cuBLAS) did not finish compiling the batch-1 and batch-64 graphs within 220 s; in what it did tune "
           "(`raw/max_autotune_partial.log`) a Triton template beat cuBLAS on some decode shapes (2 x 4096 x 1024: "
           "12.7 vs 26.2 us) and lost or tied on others: not pursued as a start-up option.", "",
           "Targets after this session:", "", "| | now | target |", "|---|---|---|",
           f"| batch-1 step | {prof['wall_ms_per_step']:.1f} ms | <= 4 ms |",
           f"| one stream, served RTF | {burst[1]['rtf']['p50']:.3f} | <= 0.025 |",
           f"| one stream, TTFA p50 | {burst[1]['ttfa_ms']['p50']:.0f} ms | <= 25 ms |",
           f"| 8 streams, aggregate | {burst[8]['x_real_time']:.0f}x | >= 150x |",
           f"| 64 streams: aggregate / smooth / TTFA p95 | {burst[64]['x_real_time']:.0f}x / "
           f"{burst[64]['smooth_playback_frac']:.0%} / {burst[64]['ttfa_ms']['p95']:.0f} ms | >= 500x / 100% / <= 300 ms |",
           f"| capacity (burst / Poisson) | {cap['burst']} / {cap['poisson']} | >= 128 |", "",
           "![served playback, tenth session](results_tenth.png)", ""]
    plot_playback([("before: every pending patch at once (ninth session's commit)", "served_tenth_before_fixes.json",
                     "s:"),
                    ("ninth session's final run (its first policy version)", "served_ninth_final.json", "v--"),
                    ("now: schedule-sized early chunks, no burst compile", "served_tenth_final.json", "o-")],
                   "Served tts_stream on one H100, 2026-11-25 (tenth session), all streams at once",
                   "results_tenth.png")
    return md
