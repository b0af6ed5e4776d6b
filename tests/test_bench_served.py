"""benchmarks/bench_served.py against a real tritonserver (tiny checkpoint, CPU)."""

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import require_module

require_module("tritonclient.grpc", "tritonclient[all] in requirements.txt")

from tests.server import REPO, edited_repository, triton_env, triton_server_factory  # noqa: E402,F401
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

BENCH = REPO / "benchmarks" / "bench_served.py"
PA_BENCH = REPO / "benchmarks" / "bench_perf_analyzer.py"
PATCHES = 8
SAMPLES_PER_PATCH = TINY_CONFIG["patch_size"] * 1920  # at the tiny model's 48 kHz output


@pytest.fixture(scope="module")
def server(triton_server_factory, tmp_path_factory):  # noqa: F811
    ckpt = write_checkpoint(str(tmp_path_factory.mktemp("bench_ckpt")), TINY_CONFIG, seed=0, progress=None)
    # Chunks by the schedule only (no playback margin): the tests count each request's chunks
    # against a probe's, and a CPU under load would send some of them early.
    repo = edited_repository(tmp_path_factory.mktemp("bench_repo") / "repo",
                              parameters={"decoder": {"playback_margin_ms": "0"}})
    return triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})


def test_bench_cli_reports_sane_numbers(server, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--url", server.grpc_url, "--concurrency", "1,2",
         "--requests-per-worker", "2", "--min-length", str(PATCHES), "--max-length", str(PATCHES),
         "--seed", "0", "--warmup", "1", "--timeout", "60", "--json-out", str(out),
         "--metrics-url", server.metrics_url, "--server-pid", str(server.pid)],
        capture_output=True, text=True, timeout=120, cwd=str(REPO),
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| conc |") and [r.split()[1] for r in rows[1:]] == ["1", "2"]

    res = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    assert res["config"]["min_length"] == res["config"]["max_length"] == PATCHES
    for lv in res["levels"]:
        c = lv["concurrency"]
        assert lv["errors"] == 0 and lv["error_messages"] == []
        assert lv["requests"] == lv["ok"] == 2 * c
        assert lv["sample_rate"] == 48000
        assert len({s["worker"] for s in lv["streams"]}) == c
        for s in lv["streams"]:
            assert s["error"] is None
            assert s["samples"] == PATCHES * SAMPLES_PER_PATCH
            assert s["audio_s"] == pytest.approx(PATCHES * SAMPLES_PER_PATCH / 48000)
            assert 0 < s["ttfa_s"] <= s["total_s"] < 60
            assert s["rtf"] == pytest.approx(s["total_s"] / s["audio_s"])
            assert s["chunks"] >= 1 and s["underrun_s"] >= 0
            assert len(s["chunk_ms"]) == s["chunks"] and s["chunk_ms"][0][0] == pytest.approx(s["ttfa_s"] * 1e3, abs=0.1)
            assert sum(ms for _, ms in s["chunk_ms"]) == pytest.approx(s["audio_s"] * 1e3, abs=0.1 * s["chunks"])
            played, late = 0.0, []  # each chunk's lateness, from its arrival and the audio before it
            for t_ms, audio_ms in s["chunk_ms"]:
                late.append(t_ms - (s["chunk_ms"][0][0] + played))
                played += audio_ms
            assert max(late) == pytest.approx(s["underrun_s"] * 1e3, abs=0.1 * s["chunks"])
            if s["underrun_chunk"] is None:
                assert s["underrun_s"] == 0
            else:
                assert late[s["underrun_chunk"]] == pytest.approx(max(late), abs=0.1 * s["chunks"])
            assert 0 <= s["start_s"] < s["end_s"] <= lv["wall_s"] + 1e-6
        assert lv["ttfa_ms"]["p50"] > 0 and lv["ttfa_ms"]["p95"] >= lv["ttfa_ms"]["p50"]
        assert lv["rtf"]["p95"] >= lv["rtf"]["p50"] > 0
        assert 0 <= lv["faster_than_realtime_frac"] <= 1 and 0 <= lv["smooth_playback_frac"] <= 1
        assert lv["audio_s_total"] == pytest.approx(2 * c * PATCHES * SAMPLES_PER_PATCH / 48000)
        assert lv["x_real_time"] == pytest.approx(lv["audio_s_total"] / lv["wall_s"])
        assert lv["client_cpu_per_s"] > 0
        # the level's minor page faults, the server's and its stubs' by model (the decoder's heap at least)
        faults = lv["minor_faults"]
        assert {"tritonserver", "decoder", "tts_stream", "tokenizer"} <= set(faults), faults
        assert faults["decoder"] > 0 and min(faults.values()) >= 0, faults
        # Triton's own statistics over the level: a decoder request per stream (which makes the audio
        # too, decode_audio: vae_decoder runs nothing)
        dec = lv["server_models"]["decoder"]
        assert dec["inferences"] >= 2 * c and dec["executions"] <= dec["inferences"]
        assert 0 < dec["infer_ms_per_execution"] and 0 < dec["busy_frac"] <= 1.05
        assert "vae_decoder" not in lv["server_models"]
        # where first audio goes, from the orchestrator's metrics: its phases sum to the server's TTFA,
        # which is within the client's
        fa = lv["first_audio_phases_ms"]
        assert set(fa) == {"total", "prepare", "decoder", "vae"} and fa["vae"] == 0, fa
        assert min(fa["total"], fa["prepare"], fa["decoder"]) > 0, fa
        assert fa["prepare"] + fa["decoder"] + fa["vae"] == pytest.approx(fa["total"], rel=1e-3)
        assert fa["total"] <= lv["ttfa_ms"]["mean"] + 1.0, (fa, lv["ttfa_ms"])
        # the engine's counters over the level: every request's patches were decoded once, in at least
        # as many steps as one worker's requests need one after the other; none counted late (the
        # CPU's launches never find a GPU stream idle)
        eng = lv["decoder_steps"]
        assert eng["rows"] == 2 * c * PATCHES and eng["steps"] >= 2 * PATCHES, eng
        assert eng["late_launches"] == 0, eng
        # the decoder's audio thread over the level: a send per chunk the clients got, and per end that
        # went alone (the rest went with their last chunks), each taking time
        chunks = sum(s["chunks"] for s in lv["streams"])
        assert eng["audio_sends"] == chunks + eng["ends_alone"] and 0 <= eng["ends_alone"] <= 2 * c, eng
        assert eng["audio_send_s"] > 0 and eng["rushes"] >= 0, eng
        # a worker's requests run one after the other on its stream
        for w in range(c):
            mine = sorted((s for s in lv["streams"] if s["worker"] == w), key=lambda s: s["index"])
            assert mine[0]["end_s"] <= mine[1]["start_s"] + 1e-6
    # concurrency 2 really overlapped its workers' first requests
    first = [s for s in res["levels"][1]["streams"] if s["index"] == 0]
    assert max(s["start_s"] for s in first) < min(s["end_s"] for s in first)


def test_bench_reports_errors(server, tmp_path):
    """A request the server rejects is counted as an error (exit 1), not a crash."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--url", server.grpc_url, "--concurrency", "1",
         "--requests-per-worker", "1", "--min-length", "5", "--max-length", "2", "--warmup", "0",
         "--timeout", "60", "--json-out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=str(REPO),
    )
    res = json.loads(out.read_text())
    lv = res["levels"][0]
    assert lv["errors"] > 0, f"the server accepted MIN_LENGTH > MAX_LENGTH: {lv}"
    assert proc.returncode == 1
    assert lv["ok"] == 0 and lv["error_messages"] and lv["x_real_time"] == 0


def test_bench_poisson_arrivals_are_staggered(server, tmp_path):
    """--arrivals poisson: each request waits an exponential gap, so a worker's first request
    does not start at the barrier and the level's starts are spread out."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--url", server.grpc_url, "--concurrency", "3",
         "--requests-per-worker", "1", "--min-length", "4", "--max-length", "4", "--warmup", "0",
         "--arrivals", "poisson", "--mean-gap", "0.5", "--timeout", "60", "--json-out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["config"]["arrivals"] == "poisson" and res["config"]["mean_gap_s"] == 0.5
    starts = sorted(s["start_s"] for s in res["levels"][0]["streams"])
    assert len(starts) == 3 and starts[-1] - starts[0] > 0.01 and starts[0] > 0.0
    assert isinstance(res["capacity"], int) and "capacity (poisson):" in proc.stdout


def test_bench_spreads_a_levels_workers_over_client_processes_and_leaves_none(server, tmp_path):
    """--client-processes 1,2: each level once in this process, then over two client processes
    (released by one barrier), every worker's requests recorded; none of its processes outlive it."""
    from tests.server import _cmdline, _pids_in_group

    out = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, str(BENCH), "--url", server.grpc_url, "--concurrency", "3",
         "--requests-per-worker", "2", "--min-length", "4", "--max-length", "4", "--warmup", "0",
         "--client-processes", "1,2", "--timeout", "60", "--json-out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    # multiprocessing's resource tracker ends when it reads EOF from the exited bench: give it a moment
    deadline = time.monotonic() + 10
    while (left := _pids_in_group(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], [_cmdline(p) for p in left]
    res = json.loads(out.read_text())
    assert res["config"]["client_processes"] == [1, 2]
    assert [(lv["concurrency"], lv["client_processes"]) for lv in res["levels"]] == [(3, 1), (3, 2)]
    pids = [{s["client_pid"] for s in lv["streams"]} for lv in res["levels"]]
    assert len(pids[0]) == 1 and len(pids[1]) == 2 and not pids[0] & pids[1]
    for lv in res["levels"]:
        assert lv["errors"] == 0 and lv["ok"] == 6
        assert sorted((s["worker"], s["index"]) for s in lv["streams"]) == [(w, i) for w in range(3) for i in range(2)]
        assert all(s["samples"] == 4 * SAMPLES_PER_PATCH and s["start_s"] >= 0 for s in lv["streams"])
        # released together (one barrier across the processes); each worker's second request after its first
        first = {s["worker"]: s for s in lv["streams"] if s["index"] == 0}
        assert max(s["start_s"] for s in first.values()) < 0.5
        for s in lv["streams"]:
            if s["index"] == 1:
                assert s["start_s"] >= first[s["worker"]]["end_s"]
    assert res["capacity_by_client_processes"].keys() == {"1", "2"}
    rows = [line for line in stdout.splitlines() if line.startswith("| 3 |")]
    assert [r.rstrip(" |").rsplit("| ", 1)[1] for r in rows] == ["1", "2"]  # the client processes column


def test_bench_refuses_bad_client_processes(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--client-processes", "0"],
                          capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert proc.returncode == 2 and "--client-processes" in proc.stderr


def test_perf_analyzer_streaming_mode(server, tmp_path):
    """benchmarks/bench_perf_analyzer.py (run_served_gpu.sh PERF_ANALYZER=1) with the venv's
    perf_analyzer on the decoupled tts_stream: its command line runs, the merged CSV parses back into
    the same levels, and the latency it reports is the whole utterance, not the first chunk."""
    patches = 24
    proc = subprocess.run(
        [sys.executable, str(PA_BENCH), "--perf-analyzer", triton_env()["PERF_ANALYZER_BIN"],
         "--url", server.grpc_url, "--levels", "1,2", "--min-length", str(patches), "--max-length", str(patches),
         "--interval-ms", "3000", "--max-trials", "5", "--stability", "60", "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=str(REPO),
    )
    log = (tmp_path / "perf_analyzer.log").read_text()
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\nlog:\n{log[-4000:]}"
    res = json.loads((tmp_path / "perf_analyzer.json").read_text())
    # one run per level, and one more for each level that did not settle (its fallback)
    unstable = sum(not lv["stable"] for lv in res["levels"])
    assert log.count(" --streaming ") == 2 + unstable and "Perf Analyzer Version 2.51.0" in log
    assert res["failed_levels"] == [] and [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    probe = res["probe"]
    assert probe["audio_s"] == pytest.approx(patches * SAMPLES_PER_PATCH / 48000) and probe["chunks"] >= 2
    for lv in res["levels"]:
        lat = lv["latency_ms"]
        # time windows, or (a CPU too busy to settle) the one-window fallback, flagged
        assert (lv["measurement"], lv["stable"]) in {("time_windows", True), ("request_count 8", False)}
        assert lv["infer_per_s"] > 0 and 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
        # identical requests: each one's chunks, the flag-only final response not counted
        assert lv["responses_per_request"] == pytest.approx(probe["chunks"], rel=1e-3)
        # send -> last audio chunk, not the first (one patch of the 24): nearer the probe's end than
        # its first audio (a busy CI machine moves both by a few hundred ms)
        assert (probe["ttfa_s"] + probe["total_s"]) / 2 < lat["p50"] / 1000 < 3 * probe["total_s"], (probe, lat)
        assert lv["x_real_time"] == pytest.approx(lv["infer_per_s"] * probe["audio_s"])
    csv_path = tmp_path / "perf_analyzer.csv"
    assert csv_path.read_text().startswith("Concurrency,Inferences/Second,Response Throughput,")
    again = tmp_path / "again.json"
    proc = subprocess.run(
        [sys.executable, str(PA_BENCH), "--summarize", str(csv_path), "--audio-s", str(probe["audio_s"]),
         "--json-out", str(again)], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    run_only = ("measurement", "stable", "time_windows_failed")
    assert json.loads(again.read_text())["levels"] == [
        {k: v for k, v in lv.items() if k not in run_only} for lv in res["levels"]]


def _level(c, errors=0, smooth=1.0, p95=100.0):
    return {"concurrency": c, "errors": errors, "smooth_playback_frac": smooth, "ttfa_ms": {"p95": p95}}


def test_capacity_is_the_largest_level_below_which_all_pass():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_served import capacity

    assert capacity([_level(1), _level(8), _level(32)]) == 32
    assert capacity([_level(1), _level(8, smooth=0.97), _level(32)]) == 1
    assert capacity([_level(8), _level(1), _level(32, p95=501.0)]) == 8
    assert capacity([_level(1, errors=1), _level(8)]) == 0
    assert capacity([]) == 0


def _at_the_barrier(barrier):
    """A client process's wait at its level's barrier: exit code 0 when released, 7 when it broke."""
    import os
    import threading

    try:
        barrier.wait(60)
    except threading.BrokenBarrierError:
        os._exit(7)
    os._exit(0)


def test_a_client_process_that_ends_before_the_barrier_releases_everyone_at_once():
    """bench_served's parent waits at a level's barrier with its client processes; one that ends before
    getting there (its imports failed, it was killed) breaks the barrier for the others and the parent at
    once, not after the 60 s they would wait; when all get there it releases them; past its timeout it
    gives up."""
    import multiprocessing
    import os
    import time

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_served import _wait_for_clients

    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    dies, waits = ctx.Process(target=os._exit, args=(3,)), ctx.Process(target=_at_the_barrier, args=(barrier,))
    for p in (dies, waits):
        p.start()
    t0 = time.monotonic()
    assert _wait_for_clients(barrier, [dies, waits], timeout=60) is False
    assert time.monotonic() - t0 < 10
    waits.join(10)
    dies.join(10)
    assert (dies.exitcode, waits.exitcode) == (3, 7)

    barrier = ctx.Barrier(3)
    both = [ctx.Process(target=_at_the_barrier, args=(barrier,)) for _ in range(2)]
    for p in both:
        p.start()
    assert _wait_for_clients(barrier, both, timeout=60) is True
    for p in both:
        p.join(10)
    assert [p.exitcode for p in both] == [0, 0]

    late = ctx.Process(target=time.sleep, args=(30,))  # alive, never at the barrier: the timeout ends the wait
    late.start()
    t0 = time.monotonic()
    assert _wait_for_clients(ctx.Barrier(2), [late], timeout=0.3) is False
    assert time.monotonic() - t0 < 10
    late.kill()
    late.join()


def test_a_worker_that_cannot_start_ends_its_level_with_an_error_not_a_hang():
    """One worker of a level failing before the barrier (here its inputs) breaks the barrier, so the
    others stop waiting for it (in one process they would wait for ever) and the level raises, naming it."""
    import threading
    import types

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_served import _run_workers

    class FailsOnce(str):
        calls = 0

        def encode(self, *a, **k):
            FailsOnce.calls += 1
            if FailsOnce.calls == 1:
                raise ValueError("not this one")
            return str.encode(self, *a, **k)

    args = types.SimpleNamespace(url="127.0.0.1:9", model="tts_stream", timeout=5, text=FailsOnce("Hello."),
                                 min_length=4, max_length=4, seed=None, cfg_value=2.0, inference_timesteps=10,
                                 arrivals="burst", mean_gap=1.0)
    outcome = []

    def level():
        try:
            _run_workers(args, range(3), "t", 3, 1, None, threading.Barrier(3))
        except RuntimeError as e:
            outcome.append(str(e))

    t = threading.Thread(target=level, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the level hung"
    assert len(outcome) == 1 and "could not start" in outcome[0] and "ValueError: not this one" in outcome[0]
    assert FailsOnce.calls == 3  # the other two got past their inputs
