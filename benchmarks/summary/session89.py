"""results.md: the eighty-ninth session's section (the closing check on an H100, its served part on the fresh
machine first)."""

from summary.raw import supervised_gpu_run

S = "eightyninth"


def eighty_ninth_session(res) -> list[str]:
    """2026-12-07: `closing_check.sh served`, then the GPU test files in two parts, on 40573dc. Sets
    res["eighty_ninth"], returns the markdown."""
    res["eighty_ninth"], served, bullets = supervised_gpu_run(
        S, "40573dc", tests_note="; 3 files in the first call after the served run, the other 11 in a second",
        drain_end="no shared-memory region left (the server ran with the supervisor's own region prefix).")
    now, before, h100 = res["eighty_ninth"], res["eighty_eighth"], res["eighty_seventh"]
    return ["", "## Eighty-ninth session (2026-12-07, NVIDIA H100 80GB HBM3): the closing check, served on a fresh "
            "machine first", "",
            "This session's code changes (the decoder's `max_batch_size` parameter renamed `max_num_seqs`, "
            "`serving/bls/` and `serving/decoder_sinks.py` split out of larger files, `tts_stream`'s "
            "`max_normalize_waiting`, the supervisor's own shared-memory region prefix, the gateway's and the "
            "client's input checks) change no GPU code; the served path's files moved. Two calls on one H100 (lent "
            f"for an nvidia-h200 call) after sixteen refused or untried ones (`raw/devrun_{S}.sh`): the served part "
            "of `closing_check.sh` first, on the fresh machine, then the GPU test files beside `gpu_check.py` "
            "(the first three in the same call).", "",
            *bullets,
            f"- Against the eighty-eighth session's H100 ({before['served_xrt_c64']:.1f}x, "
            f"{before['served_smooth_c64']:.1%} smooth, TTFA p95 {before['served_ttfa_p95_ms_c64']:.0f} ms at 64 "
            "streams, served after its GPU tests on the same machine): "
            f"{now['served_xrt_c64'] / before['served_xrt_c64']:.3f}x its throughput, and within the seven H100 runs "
            "of the seventy-eighth to eighty-seventh sessions (489.4-507.1x, 100% smooth; the eighty-seventh's "
            f"{h100['served_xrt_c64']:.1f}x). Served first on a fresh machine, as those seven were, the H100 gives "
            "their figures again: the eighty-eighth session's lower ones came with the machine or the GPU tests run "
            "just before them, not with the code. One run each, not alternated on one machine."]
