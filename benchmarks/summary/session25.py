"""results.md: the twenty-fifth session's section, and results_twentyfifth.png."""

import statistics

from summary.plots import pyplot, save_panels
from summary.raw import load


def twenty_fifth_session(res) -> list[str]:
    """2026-11-29 (issue 17, no GPU): the 64-stream stall found in Triton 2.51's Python backend and
    worked around (serving/bls_stream.py), measured on toy models on this CPU. Sets
    res["twentyfifth"], returns the markdown, draws results_twentyfifth.png."""
    runs = {k: load(f"bls_stress_{k}.json") for k in ("waiting_deadlock", "waiting_crash", "waiting_deadlock2",
                                                      "counted_unburied", "counted_first_version", "counted")}
    calls = lambda d: [r["calls"] for r in d["rounds"] if r["calls"] is not None]  # noqa: E731
    stall_round = lambda d: next((i + 1 for i, r in enumerate(d["rounds"]) if r["calls"] is None), None)  # noqa: E731
    counted = calls(runs["counted"])
    waiting = calls(runs["waiting_deadlock"])
    res["twentyfifth"] = {
        "machine": "2 CPU cores, no GPU", "calls_per_10s_round": {k: calls(d) for k, d in runs.items()},
        "stalled_in_round": {k: stall_round(d) for k, d in runs.items()},
        "counted_median": statistics.median(counted)}
    a = runs["counted"]["args"]
    md = ["## Twenty-fifth session (2026-11-29, no GPU): the 64-stream stall is Triton's, and is worked around", "",
          "No device time was left this session (84 s of 30 min), so everything here ran on the development "
          "machine (2 CPU cores). The served stall of the twenty-first and twenty-fourth sessions comes from "
          "two faults in Triton 2.51's Python backend (python_backend r24.10), both met whenever a thread waits "
          "in a decoupled BLS response iterator, which is how `tts_stream` read the decoder. Both are reproduced "
          "with no model at all by `benchmarks/bls_stress.py`: a `streamer` that sends like the decoder's audio "
          "thread (one thread, every request round-robin, each final flag right after its last response) and an "
          "async `caller` like `tts_stream`, with "
          f"{a['clients']} x {a['concurrency']} calls in flight, {a['responses']} responses each, in rounds of "
          f"{a['seconds']:.0f} s.", "",
          "- **A deadlock** (`raw/bls_stress_waiting_stall_stacks.txt`, gdb): a reader woken in "
          "`ResponseIterator::Next` holds the iterator's mutex while it takes the GIL back; the stub thread "
          "that delivers responses (`ProcessBLSResponseDecoupled`) holds the iterator map's mutex while it "
          "waits for that iterator's; a thread starting a decoupled call (`GetResponseIterator`) holds the GIL "
          "while it waits for the map's. Nothing moves again, and the streamer's `send` waits forever: the "
          "decoder's audio thread in `response_sender.send`, as in the twenty-fourth session's stall dumps.",
          "- **A crash** (`raw/bls_stress_waiting_crash.txt`, faulthandler): a finished iterator whose last "
          "reference is the stub's map is freed by the stub thread that empties the map, without the GIL. The "
          "caller's process dies, the server waits forever for it to take the next response, and new requests "
          "to it get `Stub process '...' is not healthy`, as `tts_stream_0_1` did in the twenty-fourth session.",
          "",
          "The fix, `serving/bls_stream.py`: after each `send` returns (the server has then handed the response "
          "to the caller's iterator) the decoder sends the running count to the caller's datagram socket in the "
          "server's run directory; the orchestrator calls `next()` only as far as it was told, so it never "
          "waits in the iterator (the inversion needs a waiting reader), and keeps each finished iterator "
          "2 s before letting go of it on its event loop (the stub's reference is gone by then). An uncounted "
          "first response with an error is the server's own (a refused request, final) unless its count comes "
          "within 1 s; a thread then ends the call at once. A call with no count for 5 s, or none new for 30 s while open, falls back "
          "to a waiting thread; `voxcpm_decoder_calls_read_total{read=\"waiting\"}` counts them (0 in "
          "`test_server`; the stress caller reports its own, 0 in every counted round). The decoder refuses a "
          "configuration under which a `send` could return before its response reached the caller (a response "
          "cache, ordered dynamic batching).", "",
          "A review of the first version found, and the final runs include: a fallback thread that iterated "
          "with `for` would have read a finished iterator again from its first response (Triton's `Iter()` "
          "starts a finished iterator over); the fallback came after 0.2 s, short enough for a loaded machine "
          "to reach; the decoder counted for requests before checking the internal key; the kernel queues "
          "only 10 datagrams per socket here (`net.unix.max_dgram_qlen`), so counts that do not fit now go "
          "out together, one datagram per caller. A second review found that taking every error as a call's end "
          "would cut a call short at the server's error on a counted response (no shared memory for an output, "
          "not final): counted errors now follow the counts.", "",
          "| run | reads | stalled in round | calls per 10 s round |",
          "|---|---|---|---|"]
    for key, label in (("waiting_deadlock", "before: a thread waits in each iterator"),
                       ("waiting_crash", "before, a second run"),
                       ("waiting_deadlock2", "before, a third run (final harness)"),
                       ("counted_unburied", "counted, iterators dropped at once"),
                       ("counted_first_version", "counted, first version"),
                       ("counted", "counted, final code")):
        d = runs[key]
        c = calls(d)
        md.append(f"| {label} | {d['args']['mode']} | {stall_round(d) or 'none of ' + str(len(d['rounds']))} | "
                  + (", ".join(str(x) for x in c) if c else "-") + " |")
    md += ["", "![twenty-fifth session: calls per round, and where the old reads stalled](results_twentyfifth.png)",
           "", "The counted run that dropped finished iterators at once crashed the caller the same way "
           "(`raw/bls_stress_counted_unburied_crash.txt`); keeping them is what fixed it.",
           "", f"- The final code ran {len(counted)} rounds without a stall or a crash and stopped cleanly, at a "
           f"median {statistics.median(counted):.0f} calls per round ({min(counted)}-{max(counted)}); the old reads "
           f"finished {', '.join(str(x) for x in waiting)} before their stall (separate runs on the same machine, "
           "not one call). Every call's responses arrived whole (the caller checks the count), and none was read "
           "by a waiting thread. The first counted version's median was "
           f"{statistics.median(calls(runs['counted_first_version'])):.0f}: the rounds of both spread over "
           "2,600-4,500 on this shared 2-core machine, so the two are not told apart.",
           "- The first streamer sent each final flag a round after its last response; with it the old reads ran "
           "12 rounds without a stall (`raw/bls_stress_waiting_final_apart.json`, 20 responses per call): the "
           "decoder sends its final flag right after a request's last chunk, which gives the inversion its "
           "window. At 10 requests per stream the 64-stream level starts a new decoder call every few ms, the "
           "other half of it; the sweeps with 2 per stream did not stall.",
           "- Not measured: the served benchmark on a GPU with the fix (no device time). `tests/test_bls_stream.py` "
           "runs the counted reads under load on a real server in CI; `bls_stress.py --mode waiting` is the "
           "reproduction to keep for a later Triton.", ""]
    _plot_twenty_fifth(runs, calls)
    return md


def _plot_twenty_fifth(runs, calls):
    plt = pyplot()
    fig, ax = plt.subplots(1, 1, figsize=(7, 3.6))
    for key, style, label in (("counted", "o-", "counted reads (final code)"),
                              ("counted_unburied", "s--", "counted, iterators dropped at once"),
                              ("waiting_deadlock", "x:", "a thread waiting in each iterator (before)"),
                              ("waiting_crash", "x:", None), ("waiting_deadlock2", "x:", None)):
        d = runs[key]
        c = calls(d)
        if c:
            ax.plot(range(1, len(c) + 1), c, style, label=label)
        if len(c) < len(d["rounds"]):
            ax.plot([len(c) + 1], [0], "rX", markersize=10)
    ax.plot([], [], "rX", label="stalled (deadlock or crash)")
    ax.set_xlabel("round (10 s, 2 x 64 decoupled BLS calls in flight)")
    ax.set_ylabel("calls finished per round")
    ax.set_ylim(bottom=-200)
    ax.legend(fontsize=7)
    save_panels(fig, [ax], "Twenty-fifth session, 2 CPU cores, 2026-11-29: benchmarks/bls_stress.py",
                 "results_twentyfifth.png")
