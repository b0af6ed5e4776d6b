"""results.md: the seventy-second session's section (CPU only)."""

from summary.raw import load

S = "seventysecond"


def seventy_second_session(res) -> list[str]:
    """2026-12-05 (the OpenAI gateway's robustness): no device machine could be started; what decoding a voice
    upload in a child process costs, measured on the CPU. Sets res["seventy_second"], returns the markdown."""
    up = load(f"upload_decoding_{S}.json")
    rows = up["uploads"]
    ab = load(f"gateway_ab_{S}.json")
    runs = {v: [(o["result"]["single"]["delta_p50_ms"], o["result"]["concurrent"]["ratio"])
                for o in ab["order"] if o["gateway"] == v] for v in ("old", "new")}
    res["seventy_second"] = {"device": "CPU (2 cores)", "upload_decoding_ms": rows,
                             "gateway_ab": {v: {"ttfb_over_direct_ms_p50": [d for d, _ in r],
                                                "aggregate_over_direct": [a for _, a in r]} for v, r in runs.items()}}
    md = ["", "## Seventy-second session (2026-12-05, CPU only): no device machine started; what decoding a voice "
          "upload in a child process costs the OpenAI gateway",
          "", "Seven calls for a device machine (H100 and H200, from 11:44 to 12:17 UTC) got none, so nothing here ran on "
          "a GPU; issue 17's GPU figures stay the seventy-first session's. The session hardened the OpenAI gateway "
          "against hostile clients (the commits say how): among it, uploads now decode in a child process, so a file "
          "that crashes FFmpeg or libsndfile fails its upload instead of the gateway (a 7.1 upload through PyAV "
          "crashed it before).",
          "", "**Decoding an upload** (`PYTHONPATH=gateway .venv/bin/python benchmarks/upload_decoding.py`, this "
          f"2-core machine, median of {up['reps']} after one untimed run; `raw/upload_decoding_{S}.json`): "
          "`audio_decoding.decode` in the gateway's process against the same in a child forked from the "
          "gateway's forkserver (`UploadDecoder`), ms:", "",
          "| upload | MB | in process | in a child | more |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        md.append(f"| {name} | {r['bytes'] / 1e6:.2f} | {r['in_process_ms']:.1f} | {r['in_child_ms']:.1f} | "
                  f"+{r['extra_ms']:.1f} |")
    small = [r["extra_ms"] for name, r in rows.items() if "59s" not in name]
    big = next(r for name, r in rows.items() if "59s" in name)
    md += ["",
           f"- A child costs {min(small):.0f}-{max(small):.0f} ms more an upload of 10 s: the fork and the audio's "
           "way back through a pipe. Voices are registered once and reused, so this is paid once a voice.",
           f"- The slowest upload in bounds (59 s of 8-channel 384 kHz silence, 0.2 MB of FLAC) takes "
           f"{big['in_process_ms'] / 1e3:.1f} s in the process and {big['in_child_ms'] / 1e3:.1f} s in a child (its "
           "90 MB of mono audio through the pipe); on a thread of its own, it delays no stream's encoding.",
           "- Run as the console script (`voxcpm-openai-gateway`), each child first re-ran that script, importing "
           "the whole gateway: a small upload cost 212 ms more. With `__main__`'s spec set to the package's "
           "`__main__` (as `python -m voxcpm_gateway` has it), 9 ms (one measurement while developing, not in "
           "raw/)."]

    def fmt(v: str, i: int, f: str) -> str:
        return ", ".join(f.format(r[i]) for r in runs[v])

    md += ["", "**The gateway before and after** (`VOXCPM_SUPERVISE=0 scripts/serve.sh` on the tiny checkpoint, this "
           "machine, and two gateways on it: 78f31d9's `gateway/` and this session's; `bench_gateway.py --requests 16 "
           "--formats pcm --concurrency 8 --requests-per-stream 2 --min-length 24 --max-length 24` against each in "
           f"turn, old first, {len(runs['old'])} rounds; `raw/gateway_ab_{S}.json`). Each send now runs under the "
           "stall timer, a body goes in slices of 64 KiB, and a response starts with its first bytes:", "",
           "| gateway | TTFB over direct, p50 ms | aggregate over direct, 8 streams |", "|---|---|---|",
           f"| before | {fmt('old', 0, '{:+.1f}')} | {fmt('old', 1, '{:.3f}')} |",
           f"| after | {fmt('new', 0, '{:+.1f}')} | {fmt('new', 1, '{:.3f}')} |", "",
           "- No difference shows: the rounds of either spread wider than the two differ (tritonserver and both "
           "gateways share this machine's two cores). The gateway's targets (at most 5 ms more to the first "
           "byte; no aggregate loss) were last measured on a GPU in the eighth session: +1.2 ms, 0.980."]
    return md
