"""results.md: the seventieth session's section (CPU only)."""

from summary.raw import load

S = "seventieth"


def seventieth_session(res) -> list[str]:
    """2026-12-04 (issues 17 and the serving's robustness): no device machine was lent; what a tts_stream client
    that stops reading makes tritonserver hold, measured on the CPU. Sets res["seventieth"], returns the markdown."""
    first, again = load(f"unread_one_stream_{S}.json"), load(f"unread_one_stream_again_{S}.json")
    (t_end, grown), = first["samples_s_mb"][-1:]
    res["seventieth"] = {
        "device": "CPU (2 cores), tiny checkpoint",
        "unread_stream_mb": {"first": first["samples_s_mb"], "first_after_close": first["after_close_mb"],
                             "again": again["samples_s_mb"], "again_after_close": again["after_close_mb"]},
        "unread_stream_mb_per_s": grown / t_end,
    }
    per_s = res["seventieth"]["unread_stream_mb_per_s"]
    md = ["", "## Seventieth session (2026-12-04, CPU only): no device machine lent; what a streaming client that "
          "stops reading makes tritonserver hold",
          "", "The device tool lent no machine this session (its first call was refused), so nothing here ran on a "
          "GPU. The session's changes are the serving's robustness (the commits' messages and the closing note say "
          "which); the GPU figures of issue 17 stay the sixty-ninth session's.",
          "", "**A client that stops reading** (`benchmarks/unread_streams.py --url 127.0.0.1:18001 --pid <tritonserver> "
          f"--streams 1 --patches {first['patches']} --seconds 50`, twice on one server, `scripts/serve.sh` bare on the "
          "tiny checkpoint, this CPU machine; `raw/unread_one_stream_{,again_}" + S + ".json`). One `tts_stream` "
          "stream of one CFM step a patch whose client's callback blocks, so it reads nothing past its first "
          "response; tritonserver's resident memory over what it was before, MB:", "",
          "| seconds | first run | second run |", "|---|---|---|"]
    for (t, a), (_, b) in zip(first["samples_s_mb"], again["samples_s_mb"]):
        md.append(f"| {t:g} | {a:+.0f} | {b:+.0f} |")
    md += ["",
           f"- The first run grew the server by {per_s:.2f} MB/s while the stream was decoded, {grown:.0f} MB at "
           f"{t_end:g} s: its audio, 30 KiB a patch, queued in Triton 2.51's gRPC frontend, which has no bound on "
           "what it cannot write yet.",
           f"- Closed, the stream let its memory go, to the allocator first: {first['after_close_mb']:+.0f} MB 5 s after "
           f"the first run's clients closed. In the second run, on the same server, the resident memory first fell "
           f"{-min(b for _, b in again['samples_s_mb']):.0f} MB below where it started, then rose at the same rate and "
           f"ended at {again['samples_s_mb'][-1][1]:+.0f} MB: freed and used again, not leaked.",
           "- The README's bound (\"A streaming client that stops reading\") follows: up to a stream's whole audio, "
           "`MAX_LENGTH` patches of 30 KiB, for every stream such a client holds open."]
    return md
