"""results.md: the eighty-sixth session's section (two H100 calls on the session's code: the moves of the code walk)."""

from summary.raw import load, served_levels, served_table, text

S = "eightysixth"


def eighty_sixth_session(res) -> list[str]:
    """2026-12-07: the GPU tests, gpu_check.py and the served run under the supervisor on 63b5420, after the
    supervisor became a package and runtime, loading, audio and coordination modules moved. Sets
    res["eighty_sixth"], returns the markdown."""
    chk = load(f"gpu_check_{S}.json")
    tests = [line for line in text(f"gpu_tests_{S}.txt").splitlines() if line and not line.startswith("#")]
    served = served_levels(f"served_supervised_{S}.json")
    drain = load(f"drain_{S}.json")
    one, c64 = served[1], served[64]
    passed = sum(int(t.split(": ")[1].split(" passed")[0]) for t in tests)
    res["eighty_sixth"] = {"device": chk["device"], "commit": "63b5420", "gpu_test_files": len(tests),
                           "gpu_tests_passed": passed,
                           "gpu_check_pass": all(v["pass"] for k, v in chk.items() if isinstance(v, dict) and "pass" in v)
                           and all(g["pass"] for g in chk["graph_vs_eager"].values()),
                           "teacher_forced_cosine_min": chk["teacher_forced"]["cosine_min"],
                           "served_rtf_p50_c1": one["rtf"]["p50"], "served_ttfa_p50_ms_c1": one["ttfa_ms"]["p50"],
                           "served_xrt_c64": c64["x_real_time"], "served_smooth_c64": c64["smooth_playback_frac"],
                           "served_ttfa_p95_ms_c64": c64["ttfa_ms"]["p95"],
                           "drain": {k: drain[k] for k in ("streams", "ended_shutting_down", "supervisor_exit_s",
                                                           "tritonserver_exit_code", "exit_timeout_expired", "crashes")}}
    return ["", "## Eighty-sixth session (2026-12-07, NVIDIA H100 80GB HBM3): the code walk's moves on the GPU",
            "", "This session moved code without changing what it does: the supervisor became the package "
            "`voxcpm_triton/supervisor/` (`scripts/supervise.py` its entry point), `coordination/`, `loading.py` and "
            "`audio/` left `serving/`, `voxcpm2.py` and `engine/`. Two calls on 63b5420, the first device machine "
            f"after nine refused tries (`raw/devrun_{S}.sh`):", "",
            f"- **GPU tests**, each file in its own pytest process: {len(tests)} files, {passed} passed, no failure "
            f"(`raw/gpu_tests_{S}.txt`; `test_audio_vae.py`, added this time, needs the official `voxcpm` package, "
            "which the device has not, and was not collected).",
            f"- **`gpu_check.py`** (`raw/gpu_check_{S}.{{json,log}}`): bf16 against fp32 teacher-forced cosine min "
            f"{chk['teacher_forced']['cosine_min']:.5f}; decode graphs against eager max abs 0 at batches "
            f"{', '.join(chk['graph_vs_eager'])}; prefill graph max abs {chk['prefill_graph_vs_eager']['max_abs']:.0f}; "
            f"the served VAE {chk['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.2e} from exact fp32 (bound "
            f"{chk['vae_graphs_vs_eager']['served_bound']:.0e}): all pass.",
            "- **Served under the supervisor** (`SET=\"decoder.timestep_buckets=10,100\" ARRIVALS=burst LEVELS=1,64 "
            f"REQUESTS=2 DRAIN=4 bash benchmarks/run_served_gpu.sh`; `raw/served_supervised_{S}.{{json,log}}`, "
            f"`raw/drain_{S}.json`, `raw/served_supervised_{S}_tritonserver.log.gz`):", "",
            *served_table(dict(sorted(served.items()))), "",
            f"- The drain: {drain['ended_shutting_down']} of {drain['streams']} long streams ended with \"the server is "
            f"shutting down\" at {drain['ended_s']['median']:.1f} s, the supervisor was gone at "
            f"{drain['supervisor_exit_s']:.1f} s, tritonserver's exit code {drain['tritonserver_exit_code']}, "
            f"{drain['crashes']} crashes; no shared-memory region left.",
            f"- Issue 17 on this H100: one stream RTF {one['rtf']['p50']:.4f} (target 0.025: missed), TTFA p50 "
            f"{one['ttfa_ms']['p50']:.1f} ms; 64 streams at once {c64['x_real_time']:.1f}x, "
            f"{c64['smooth_playback_frac']:.0%} smooth, TTFA p95 {c64['ttfa_ms']['p95']:.0f} ms. The eighty-fifth "
            "session's two H100 calls gave RTF 0.0363 and 0.0365, 497.6x and 498.8x: the moves changed nothing "
            "served beyond the spread between calls; the H200 headline stands."]
