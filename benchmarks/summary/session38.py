"""results.md: the thirty-eighth session's section (no device time, so no figures)."""


def thirty_eighth_session(res) -> list[str]:
    """2026-11-30: no GPU. CI's perf_analyzer flake, the split's never-run GPU test, summarize.py split up.
    Reads and sets nothing in `res`."""
    return [
        "## Thirty-eighth session (2026-11-30, no GPU): the split's GPU test corrected before its first run; "
        "summarize.py split by session", "",
        "No device time was left (the thirty-seventh session's work had not landed, and this session counted as "
        "its retry), so nothing here is measured on a GPU and no default changed.", "",
        "- **CI.** The thirty-seventh session's submission failed CI in `test_perf_analyzer_http`: on the busy "
        "2-core runner perf_analyzer found no 5 time windows within 50% of each other. The perf_analyzer tests "
        "against the test servers now measure a fixed request count (`--request-count`), which has no stability "
        "search; what they check (perf_analyzer drives a real server, every request succeeds) is unchanged.",
        "- **The split along K (`VOXCPM_SPLIT_K=1`, still opt-in and unmeasured in the engine).** A review of its "
        "GPU test, which has never run, found that it could not pass: it compared sorted shapes in the wrong "
        "order, and its tracing hook (a list that dynamo guards) made the call inside CUDA-graph capture compile "
        "again. The test now compares sets, compiles with `fullgraph=True`, passes the weights as Parameters (as "
        "the engine does), and captures a second compile without the hook after two warm-up calls. The same "
        "flow ran on the CPU under `aot_eager` with the device check left out, at 176 tokens: both projections traced, max abs "
        "error 0.040 against the unsplit 0.039 (float64 reference), no recompile over three calls. The split "
        "no longer runs in fp16 (a half rounded to fp16 could overflow where the whole sum does not); the "
        "thirty-seventh section above describes the bf16/fp16 version. With the flag on, the first prefill past "
        "1536 rows in a layer compiles that layer again (the row bound is a guard); README's row says so. "
        "The next session's first device call is still the one the thirty-seventh section's **Next** names.",
        "- **The code behind this file.** `benchmarks/summarize.py` (5,635 lines, one function appended per session) is now "
        "the headline tables plus `SECTIONS`; each session's section and plot is `benchmarks/summary/sessionNN.py`. "
        "results.md, results.json and every figure came out byte-identical. `tests/test_results_summary.py` now "
        "fails when results.md or results.json is not what summarize.py makes from `raw/`. Regenerated, "
        "`results.png` had mixed the twenty-sixth session's H200 single-stream RTF (0.043) into the sixth "
        "session's H100 overview; it is drawn from that run alone again (0.051).", "",
    ]
