"""results.md: the eighty-sixth session's section (two H100 calls on the session's code: the moves of the code walk)."""

from summary.raw import supervised_gpu_run

S = "eightysixth"


def eighty_sixth_session(res) -> list[str]:
    """2026-12-07: the GPU tests, gpu_check.py and the served run under the supervisor on 63b5420, after the
    supervisor became a package and runtime, loading, audio and coordination modules moved. Sets
    res["eighty_sixth"], returns the markdown."""
    res["eighty_sixth"], _, bullets = supervised_gpu_run(
        S, "63b5420", tests_note="; `test_audio_vae.py`, added this time, needs the official `voxcpm` package, "
        "which the device has not, and was not collected", drain_end="no shared-memory region left.")
    return ["", "## Eighty-sixth session (2026-12-07, NVIDIA H100 80GB HBM3): the code walk's moves on the GPU",
            "", "This session moved code without changing what it does: the supervisor became the package "
            "`voxcpm_triton/supervisor/` (`scripts/supervise.py` its entry point), `coordination/`, `loading.py` and "
            "`audio/` left `serving/`, `voxcpm2.py` and `engine/`. Two calls on 63b5420, the first device machine "
            f"after nine refused tries (`raw/devrun_{S}.sh`):", "",
            *bullets[:-1],
            bullets[-1] + " The eighty-fifth session's two H100 calls gave RTF 0.0363 and 0.0365, 497.6x and 498.8x: "
            "the moves changed nothing served beyond the spread between calls; the H200 headline stands."]
