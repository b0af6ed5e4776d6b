"""results.md: the eighty-seventh session's section (two H100 calls on the session's code: gpu/ and audio/patches.py)."""

from summary.raw import supervised_gpu_run

S = "eightyseventh"


def eighty_seventh_session(res) -> list[str]:
    """2026-12-07: the served run under the supervisor, then the GPU tests and gpu_check.py, on d748d2c, after
    bucket tables, CUDA graph capture and host copies left engine/ for gpu/ and encode_patches left loading.py
    for audio/patches.py. Sets res["eighty_seventh"], returns the markdown."""
    res["eighty_seventh"], _, bullets = supervised_gpu_run(S, "d748d2c", drain_end="no shared-memory region left.")
    prev = res["eighty_sixth"]
    now = res["eighty_seventh"]
    return ["", "## Eighty-seventh session (2026-12-07, NVIDIA H100 80GB HBM3): gpu/ and audio/patches.py on the GPU",
            "", "This session moved the engine's bucket tables, CUDA graph capture and host copies to `gpu/`, which "
            "`engine/` and `audio/` share, and `encode_patches` to `audio/patches.py`; nothing else it changed runs on "
            "the GPU. Two calls on d748d2c, one warm machine after seven refused tries, the served run first "
            f"(`raw/devrun_{S}.sh`):", "",
            *bullets[:-1],
            bullets[-1] + " The seventy-eighth to eighty-sixth sessions' six H100 runs of this table gave one-stream "
            "TTFA p50 17.2-23.8 ms and, at 64 streams, 489.4-507.1x with TTFA p95 117-191 ms: this call is inside "
            f"those but for one stream's TTFA p50, {now['served_ttfa_p50_ms_c1'] - 23.8:.1f} ms above, from 2 requests. "
            f"Against the eighty-sixth session's call alone, 64 streams made {now['served_xrt_c64'] / prev['served_xrt_c64']:.3f}x "
            "its throughput, on code whose GPU path this session only moved. The H200 headline stands."]
