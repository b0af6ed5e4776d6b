"""results.md: the seventy-second session's section (CPU only)."""

from summary.raw import load

S = "seventysecond"


def seventy_second_session(res) -> list[str]:
    """2026-12-05 (the OpenAI gateway's robustness): no device machine could be started; what decoding a voice
    upload in a child process costs, measured on the CPU. Sets res["seventy_second"], returns the markdown."""
    up = load(f"upload_decoding_{S}.json")
    rows = up["uploads"]
    res["seventy_second"] = {"device": "CPU (2 cores)", "upload_decoding_ms": rows}
    md = ["", "## Seventy-second session (2026-12-05, CPU only): no device machine started; what decoding a voice "
          "upload in a child process costs the OpenAI gateway",
          "", "Six calls for a device machine (H100 and H200, from 11:44 to 12:10 UTC) got none, so nothing here ran on "
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
    return md
