"""What the model processes of one server share (coordination/runtime.py, run_state.py, liveness.py,
processes.py), the liveness probe's verdicts
and the supervisor's arguments: plain Python, no server."""

import errno
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.server import REPO, _children
from voxcpm_triton.coordination import liveness, processes, run_state, runtime
from voxcpm_triton.supervisor import cli, groups, guard, leftovers, loop, ports, probe, server_args, tritonserver



@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXCPM_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("VOXCPM_INTERNAL_KEY", raising=False)
    return tmp_path


def test_the_run_dirs_real_path_follows_the_setting_and_resolves_links(tmp_path, monkeypatch):
    """Cached per setting (every request's counting inbox is checked against it), never across settings."""
    real_a, real_b = tmp_path / "a", tmp_path / "b"
    real_a.mkdir()
    (tmp_path / "link").symlink_to(real_a)
    monkeypatch.setenv("VOXCPM_RUN_DIR", str(tmp_path / "link"))
    assert run_state.run_dir_realpath() == str(real_a) == run_state.run_dir_realpath()
    monkeypatch.setenv("VOXCPM_RUN_DIR", str(real_b))
    assert run_state.run_dir_realpath() == str(real_b) and real_b.is_dir()  # made, as run_dir() makes it
    monkeypatch.setenv("VOXCPM_RUN_DIR", str(tmp_path / "link"))
    assert run_state.run_dir_realpath() == str(real_a)


def _key(q):
    q.put(run_state.internal_key())


def test_processes_racing_for_the_internal_key_all_get_the_same_one(run_dir):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_key, args=(q,)) for _ in range(8)]
    for p in procs:
        p.start()
    keys = {q.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(30)
    assert len(keys) == 1 and len(keys.pop()) == 64
    assert oct((run_dir / "internal.key").stat().st_mode & 0o777) == "0o600"
    assert [f.name for f in run_dir.iterdir()] == ["internal.key"]  # no temporary files left


def test_the_environment_key_wins_and_requests_are_matched_exactly(run_dir, monkeypatch):
    monkeypatch.setenv("VOXCPM_INTERNAL_KEY", "s3cret")
    assert run_state.internal_key() == "s3cret"
    assert run_state.key_matches(json.dumps({run_state.KEY_PARAMETER: "s3cret"}), "s3cret")
    for params in ("", "{}", "not json", "[1]", json.dumps({run_state.KEY_PARAMETER: "s3cre"}),
                   json.dumps({run_state.KEY_PARAMETER: 5}), json.dumps({"other": "s3cret"})):
        assert not run_state.key_matches(params, "s3cret"), params


def wait_for_verdict(cond, hang_s=10.0):
    deadline = time.monotonic() + hang_s
    while not cond(v := liveness.unhealthy()):
        assert time.monotonic() < deadline, f"the beacon thread did not rewrite the beacon: still {v!r}"
        time.sleep(0.01)
    return v


def test_the_stop_deadline_is_read_from_the_run_directory(run_dir, monkeypatch):
    """scripts/supervise.py writes `stopping` (epoch seconds) before its SIGTERM; the models read
    it, at most every STOPPING_READ_S."""
    monkeypatch.setattr(runtime, "_stop_read", (float("-inf"), None))
    monkeypatch.setattr(runtime, "STOPPING_READ_S", 0.0)
    assert runtime.stop_deadline() is None and not runtime.stopping()
    (run_dir / runtime.STOPPING_FILE).write_text("not a time")
    assert runtime.stop_deadline() is None
    (run_dir / runtime.STOPPING_FILE).write_text(repr(1000.5))
    assert runtime.stop_deadline() == 1000.5
    assert not runtime.stopping(now=1000.0) and runtime.stopping(now=1000.5) and runtime.stopping()
    monkeypatch.setattr(runtime, "STOPPING_READ_S", 60.0)
    (run_dir / runtime.STOPPING_FILE).unlink()
    assert runtime.stop_deadline() == 1000.5  # read less than STOPPING_READ_S ago


def test_a_server_whose_supervisor_died_is_stopping(run_dir, monkeypatch):
    """Killed with SIGKILL, the supervisor writes no `stopping`; its server gets SIGTERM (the death
    signal it set), so the models end their requests before tritonserver's forced exit."""
    monkeypatch.setattr(runtime, "_stop_read", (float("-inf"), None))
    monkeypatch.setattr(runtime, "STOPPING_READ_S", 0.0)
    monkeypatch.setenv("VOXCPM_SUPERVISOR_PID", str(os.getpid()))
    assert runtime.stop_deadline() is None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv("VOXCPM_SUPERVISOR_PID", str(gone.pid))
    assert runtime.stop_deadline() is not None and runtime.stopping()


def test_a_process_is_dead_once_it_has_exited_and_alive_while_its_state_cannot_be_read(monkeypatch):
    """Dead means the caller's responses are dropped and a supervisor's server stops: a /proc read that
    fails for another reason (no file descriptors left, say) must not mean dead."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while processes.proc_fields(zombie.pid)[0] != "Z":  # exited, not yet reaped
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    assert processes.process_alive(os.getpid()) and not processes.process_alive(zombie.pid)
    zombie.wait()
    assert not processes.process_alive(zombie.pid)

    def unreadable(pid):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(processes, "proc_fields", unreadable)
    assert processes.process_alive(zombie.pid)


def test_the_loaded_lora_adapters_are_kept_for_the_supervisors_next_server(tmp_path, monkeypatch):
    monkeypatch.delenv("VOXCPM_STATE_DIR", raising=False)
    run_state.save_loras(["a"])  # no supervisor: nothing kept, nothing read
    assert run_state.saved_loras() is None
    monkeypatch.setenv("VOXCPM_STATE_DIR", str(tmp_path))
    assert run_state.saved_loras() is None
    run_state.save_loras(["c", "a"])
    assert run_state.saved_loras() == ["c", "a"] and os.listdir(tmp_path) == [run_state.LORAS_FILE]
    (tmp_path / run_state.LORAS_FILE).write_text("{not json")
    assert run_state.saved_loras() is None


def test_beacons_tell_a_live_model_from_a_dead_a_stuck_and_a_broken_one(run_dir):
    status = {"error": None}
    beacon = liveness.Beacon("decoder", lambda: status["error"], period_s=0.05)
    assert liveness.unhealthy() is None
    # The beacon's own thread rewrites it: wait for the verdict to change (10 s only bounds a hang;
    # a fixed sleep would make the result depend on how busy the machine is).
    status["error"] = "the engine thread crashed: boom"
    verdict = wait_for_verdict(lambda v: v is not None)
    assert "decoder model cannot serve: the engine thread crashed: boom" in verdict
    status["error"] = None
    assert wait_for_verdict(lambda v: v is None) is None
    assert "has not answered" in liveness.unhealthy(now=time.time() + liveness.BEACON_STALE_S + 5)
    assert liveness.unhealthy(models=("tokenizer",)) is None  # only the models asked about
    beacon.stop()
    assert list(run_dir.glob("decoder.*")) == []
    # A process that died without cleaning up: its beacon names it.
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    (run_dir / f"vae_decoder.{child}.json").write_text(json.dumps({"pid": child, "beat": time.time(), "error": None}))
    assert liveness.unhealthy() == f"the vae_decoder model process (pid {child}) has died"


@pytest.mark.parametrize("message, status", [
    ("VoxCPM server unhealthy: the decoder model process (pid 7) has died", probe.BROKEN),
    ("server busy: 256 requests are already waiting for the decoder", probe.HEALTHY),
    ("Stub process 'tts_stream_0_1' is not healthy.", probe.BROKEN),
    ("TEXT is empty", probe.UNHEALTHY),
])
def test_probe_verdicts(message, status):
    assert probe._classify(message)[0] == status


def test_probe_of_nothing_listening_is_unhealthy():
    from tests.server import free_port

    status, what = probe.probe(f"http://127.0.0.1:{free_port()}", timeout=5)
    assert status == probe.UNHEALTHY and "no answer" in what


@pytest.mark.parametrize("engine", ["busy", "idle", "only_the_probe", "nothing_waits", "broken_metrics"])
def test_a_probe_queued_behind_running_requests_is_alive_while_the_engine_decodes(engine):
    """A probe that gets no audio in time because long requests fill the decoder is not a broken
    server (a review had the supervisor restart a busy one, cutting every stream): with the metrics
    URL, a timed-out probe is healthy while requests wait for the decoder and its decode steps go on
    past the probe's own; unhealthy when they stand still, when only its own steps ran, when nothing
    waits (the probe is stuck, not queued), when the metrics cannot be read, and without the URL."""
    import http.server
    import threading

    steps = [100]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the metrics endpoint, two decoder instances
            if engine == "broken_metrics":
                self.wfile.write(b"garbage\r\n")  # not even a status line
                return
            steps[0] += {"busy": 7, "nothing_waits": 7, "only_the_probe": 1}.get(engine, 0)
            waiting = 0 if engine == "nothing_waits" else 40
            body = (f'voxcpm_engine_decode_steps_total{{gpu="0"}} {steps[0]}\n'
                    f'voxcpm_engine_decode_steps_total{{gpu="1"}} 5.0e0\n'
                    f'voxcpm_engine_waiting_requests{{gpu="0"}} {waiting}\n'
                    f'voxcpm_engine_waiting_requests{{gpu="1"}} 0\n').encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # the probe's synthesis: queued, never answered in time
            time.sleep(2.0)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        if engine != "broken_metrics":
            assert probe.engine_load(url)[1] == (0 if engine == "nothing_waits" else 40)
        status, what = probe.probe(url, timeout=0.5, metrics_url=url)
        if engine == "busy":
            assert status == probe.HEALTHY and "alive but busy" in what and "40 requests still wait" in what, what
        else:
            assert status == probe.UNHEALTHY and "no answer" in what, what
        assert probe.probe(url, timeout=0.5)[0] == probe.UNHEALTHY  # no metrics URL: as before
    finally:
        srv.shutdown()
        srv.server_close()


def test_supervisor_restricts_the_admin_apis_unless_told_otherwise(monkeypatch):
    class Opts:
        probe_interval = probe_timeout = probe_failures = start_timeout = 1

    monkeypatch.setenv("VOXCPM_ADMIN_KEY", "k")
    s = loop.Supervisor(["tritonserver", "--http-port=1234", "--http-address=0.0.0.0",
                        "--exit-timeout-secs=7"], Opts)
    assert "--http-restricted-api=shared-memory,model-repository,logging,trace:voxcpm-admin-key=k" in s.server.args
    assert "--grpc-restricted-protocol=shared-memory,model-repository,logging,trace:voxcpm-admin-key=k" in s.server.args
    assert s.server.url == "http://127.0.0.1:1234" and s.server.exit_timeout == 7
    assert loop.Supervisor(["t", "--http-address", "ipv6:[::]", "--http-port=5"], Opts).server.url == "http://[::1]:5"
    assert loop.Supervisor(["t", "--http-address=::1"], Opts).server.url == "http://[::1]:8000"
    # the probe's metrics URL (a probe queued behind work is alive while the engine decodes)
    assert s.server.metrics_url == "http://127.0.0.1:8002"
    assert loop.Supervisor(["t", "--metrics-port=9", "--metrics-address=::"], Opts).server.metrics_url == "http://[::1]:9"
    assert loop.Supervisor(["t", "--allow-metrics=false"], Opts).server.metrics_url is None
    mine = ["tritonserver", "--http-restricted-api=trace:h=v"]
    args = loop.Supervisor(mine, Opts).server.args  # a region prefix of its own added (server_args.OWN_PREFIX)
    assert args[:-1] == mine and server_args.OWN_PREFIX.fullmatch(server_args.shm_prefix(args)), args
    assert server_args.shm_prefix(loop.Supervisor(mine, Opts).server.args) != server_args.shm_prefix(args)
    given = [*mine, "--backend-config=python,shm-region-prefix-name=theirs_"]  # one given is kept
    assert loop.Supervisor(given, Opts).server.args == given


def test_the_supervisor_finds_the_shared_memory_regions_its_servers_processes_are_given():
    """The regions a stopped server's model processes leave are the ones named on their command lines,
    with the python backend's prefix (its default, or the server's shm-region-prefix-name)."""
    assert server_args.shm_prefix(["tritonserver", "--http-port=1"]) == "triton_python_backend_shm_region_"
    assert server_args.shm_prefix(["tritonserver", "--backend-config=python,shm-region-prefix-name=mine_"]) == "mine_"
    def regions(pgid, prefix):
        return leftovers.shm_regions(groups.commands_of(pgid), prefix)

    name = "triton_python_backend_shm_region_0123abcd"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", name, "/dev/shm/" + name, "other"],
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while leftovers.shm_regions(groups.commands_of(child.pid), "triton_python_backend_shm_region_") != {name}:
            assert time.monotonic() < deadline, leftovers.shm_regions(groups.commands_of(child.pid), "triton_python_backend_shm_region_")
            time.sleep(0.05)
        assert leftovers.shm_regions(groups.commands_of(child.pid), "mine_") == set()
    finally:
        child.kill()
        child.wait()
    assert regions(child.pid, "triton_python_backend_shm_region_") == set()  # the group is gone


def test_a_server_does_not_outlive_its_supervisor(tmp_path):
    """SIGKILL to scripts/supervise.py (nothing can catch it) still ends the server it started."""
    import signal

    from tests.server import free_port

    marker = tmp_path / "child.pid"
    child = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    # TMPDIR: the run directory the supervisor makes, which its SIGKILL leaves behind, goes with tmp_path
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", VOXCPM_RUN_DIR=str(tmp_path / "run"), TMPDIR=str(tmp_path))
    sup = subprocess.Popen([sys.executable, str(REPO / "scripts" / "supervise.py"), "--", sys.executable, "-c", child,
                            f"--http-port={free_port()}"], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the supervised process did not start"
            time.sleep(0.05)
        time.sleep(0.2)
        pid = int(marker.read_text())
        sup.send_signal(signal.SIGKILL)
        sup.wait(10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]:
            assert time.monotonic() < deadline, "the server outlived its supervisor"
            time.sleep(0.05)
    finally:
        if sup.poll() is None:
            sup.kill()


@pytest.mark.parametrize("stub_ends", [False, True])
def test_a_killed_supervisors_guard_ends_what_its_server_left(tmp_path, stub_ends):
    """Model processes caught mid-load when the supervisor is killed can hang in Triton's stub for good
    once their server is gone. The guard the supervisor starts beside each server (supervisor/guard.py)
    kills them once the server has exited and they have not followed within 5 s; then, as the next
    supervisor would, it removes the killed supervisor's state directory and the shared-memory regions
    recorded there, which a server stopped by its death signal leaves (on a GPU, 21 of them)."""
    import glob
    import signal
    import uuid

    from tests.server import free_port

    region = f"voxcpm_test_{uuid.uuid4().hex}"
    marker = tmp_path / "stub.pid"
    # the server exits at its SIGTERM; its "model process" (same group) ends once the server is gone, as
    # Triton's do (leaving its region), or never
    stub = (f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); server = os.getppid(); "
            f"open('/dev/shm/{region}', 'w').close(); open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
            f"while {not stub_ends} or os.getppid() == server: time.sleep(0.1)")
    server = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {stub!r}, {region!r}]); time.sleep(300)"
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=str(tmp_path))
    sup = subprocess.Popen([sys.executable, str(REPO / "scripts" / "supervise.py"), "--", sys.executable, "-c", server,
                            f"--http-port={free_port()}", "--backend-config=python,shm-region-prefix-name=voxcpm_test_"],
                           env=env, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text() and (dirs := glob.glob(str(tmp_path / "voxcpm-run-*")))
                   and region in leftovers.recorded_regions(dirs[0])):
            assert time.monotonic() < deadline, "the stand-in model process did not start, or was not noted"
            time.sleep(0.05)
        pid = int(marker.read_text())
        [guard_pid] = [p for p in _children(sup.pid) if guard.__name__ in groups.command_line(p)]
        sup.send_signal(signal.SIGKILL)
        sup.wait(10)
        deadline = time.monotonic() + 20
        while processes.process_alive(pid) or processes.process_alive(guard_pid):
            assert time.monotonic() < deadline, "the server's model process or the guard outlived the supervisor"
            time.sleep(0.1)
        assert not os.path.exists(f"/dev/shm/{region}") and glob.glob(str(tmp_path / "voxcpm-run-*")) == []
        killed = "killed 0 process(es) its server left" if stub_ends else f"killed 1 process(es) its server left: [{pid}]"
        assert (f"guard: the supervisor is gone; {killed}; removed {dirs[0]} and "
                f"{1 if stub_ends else 0} shared-memory region(s)") in sup.stderr.read()
    finally:
        if sup.poll() is None:
            sup.kill()
        if pid and processes.process_alive(pid):
            os.kill(pid, signal.SIGKILL)
        if os.path.exists(f"/dev/shm/{region}"):
            os.unlink(f"/dev/shm/{region}")


def _supervise(tmp_path, server: str, *args: str, opts=()):
    """scripts/supervise.py run to its end on a stand-in server (`python -c server args...`)."""
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, str(REPO / "scripts" / "supervise.py"), *opts, "--", sys.executable,
                           "-c", server, *args], env=env, capture_output=True, text=True, timeout=120)


def test_the_supervisor_gives_up_on_a_server_that_never_becomes_ready(tmp_path):
    """A server that exits at once (a bad checkpoint) is started --max-failed-starts times, backing off,
    then the supervisor exits 1 saying why, instead of restarting it forever."""
    from tests.server import free_port

    count = tmp_path / "starts"
    server = f"open({str(count)!r}, 'a').write('x'); raise SystemExit(3)"
    p = _supervise(tmp_path, server, f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                   f"--metrics-port={free_port()}", opts=("--max-failed-starts", "3"))
    assert p.returncode == 1, p.stderr
    assert count.read_text() == "xxx"
    assert ("giving up: 3 start(s) in a row did not serve (never ready, or never passed a probe); the last: "
            "tritonserver exited with code 3") in p.stderr


def _ready_but_failing_server(first: str = "") -> str:
    """A stand-in server (its code, for `_supervise`): ready on its --http-port, every synthesis a 500;
    `first` runs before it serves."""
    return first + """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        self.send_response(500); self.end_headers(); self.wfile.write(b'{"error": "cannot synthesize"}')
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1].split("=")[1])), H).serve_forever()
"""


def test_the_supervisor_gives_up_on_a_server_that_is_ready_but_never_passes_a_probe(tmp_path):
    """Ready, then failing every synthesis (a model that loads but cannot run): each start counts as
    failed until one passes a probe, so this too ends in exit 1 instead of a restart loop."""
    from tests.server import free_port

    port = free_port()
    p = _supervise(tmp_path, _ready_but_failing_server(), f"--http-port={port}", "--http-address=127.0.0.1", f"--grpc-port={free_port()}",
                   f"--metrics-port={free_port()}",
                   opts=("--max-failed-starts", "2", "--probe-interval", "0.2", "--probe-failures", "1"))
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("tritonserver ready after") == 2, p.stderr
    assert "did not serve (never ready, or never passed a probe); the last: probe failed 1 times: {\"error\": \"cannot" in p.stderr


def test_the_supervisor_leaves_another_servers_python_env_alone(tmp_path):
    """A server without model processes makes no /tmp/python_env_*: the one new directory since its
    start is then another server's (one starting beside it), which must not be removed at its stop
    (Triton aborts at its exit if its directory is gone). Here the stand-in server makes that
    directory itself, becomes ready, fails its probe and is stopped."""
    import shutil

    from tests.server import free_port

    other = f"/tmp/python_env_voxcpmtest{os.getpid()}_{time.monotonic_ns()}"
    port = free_port()
    try:
        p = _supervise(tmp_path, _ready_but_failing_server(f"import os; os.mkdir({other!r})"), f"--http-port={port}", "--http-address=127.0.0.1",
                       f"--grpc-port={free_port()}", f"--metrics-port={free_port()}",
                       opts=("--max-failed-starts", "1", "--probe-interval", "0.2", "--probe-failures", "1"))
        assert p.returncode == 1 and "tritonserver ready after" in p.stderr, p.stderr
        assert os.path.isdir(other), p.stderr
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_companion_that_keeps_exiting_at_once_stops_everything(tmp_path):
    """A gateway that refuses its settings (exit 2) would otherwise be restarted every 30 s forever."""
    from tests.server import free_port

    marker = tmp_path / "server.pid"
    server = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    companion = f"{sys.executable} -c 'raise SystemExit(2)'"
    p = _supervise(tmp_path, server, f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                   f"--metrics-port={free_port()}", opts=("--max-failed-starts", "2", "--companion", companion))
    assert p.returncode == 1, p.stderr
    assert "exited 2 times in a row within a minute of its start (last exit code 2)" in p.stderr, p.stderr
    # its last exit is not followed by a restart it will not get, nor the server's stop by "asked to stop"
    lines = p.stderr.splitlines()
    assert sum("exited with code 2; restarting in" in line for line in lines) == 1, p.stderr
    assert any(line.endswith("exited with code 2") for line in lines), p.stderr
    assert "stopping tritonserver (giving up: " in p.stderr and "asked to stop" not in p.stderr, p.stderr
    pid = int(marker.read_text())
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]


@pytest.mark.parametrize("how", ["gateway_drain", "flag", "sighup"])
def test_a_stopping_companion_gets_the_grace_it_is_given(tmp_path, how):
    """A companion that takes 2 s to drain after SIGTERM: under the default grace, the gateway's own
    drain (VOXCPM_OPENAI_SHUTDOWN_TIMEOUT, here 0.5 s) plus 5 s, it ends on its own; with
    --companion-grace 0.5 it is killed. A gateway given a longer drain is not cut short. SIGHUP (the
    terminal of scripts/serve.sh closed) stops everything as SIGTERM does, drain included."""
    import signal

    from tests.server import free_port

    started = tmp_path / "companion.started"
    script = tmp_path / "companion.py"
    script.write_text(f"""import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0)))
open({str(started)!r}, "w").write("x")
time.sleep(300)
""")
    opts = ["--companion-grace", "0.5"] if how == "flag" else []
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=str(tmp_path), VOXCPM_OPENAI_SHUTDOWN_TIMEOUT="0.5")
    env.pop("VOXCPM_COMPANION_GRACE", None)
    log = tmp_path / "supervise.log"
    with open(log, "w") as f:
        # SIGHUP's default action, whatever this test runs under (nohup would pass its SIG_IGN on)
        sup = subprocess.Popen([sys.executable, str(REPO / "scripts" / "supervise.py"), *opts, "--companion",
                                f"{sys.executable} {script}", "--", sys.executable, "-c", "import time; time.sleep(300)",
                                f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                                f"--metrics-port={free_port()}"], env=env, stderr=f,
                               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline and sup.poll() is None, log.read_text()
            time.sleep(0.05)
        sup.send_signal(signal.SIGHUP if how == "sighup" else signal.SIGTERM)
        assert sup.wait(60) == 0, log.read_text()
    finally:
        if sup.poll() is None:
            sup.kill()
    text = log.read_text()
    if how == "flag":
        assert "python did not exit in time: SIGKILL" in text and "stopped (by Killed)" in text, text
    else:
        assert "did not exit in time" not in text and "python stopped (exit code 0)" in text, text


def test_a_supervisor_started_under_nohup_keeps_ignoring_sighup(tmp_path):
    """nohup (SIGHUP ignored, inherited through serve.sh's exec): the terminal closing stops nothing."""
    import signal

    from tests.server import free_port

    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=str(tmp_path))
    log = tmp_path / "supervise.log"
    with open(log, "w") as f:
        sup = subprocess.Popen([sys.executable, str(REPO / "scripts" / "supervise.py"), "--", sys.executable, "-c",
                                "import time; time.sleep(300)", f"--http-port={free_port()}",
                                f"--grpc-port={free_port()}", f"--metrics-port={free_port()}"], env=env, stderr=f,
                               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 30
        while "tritonserver started" not in log.read_text():
            assert time.monotonic() < deadline and sup.poll() is None, log.read_text()
            time.sleep(0.05)
        sup.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert sup.poll() is None and "asked to stop" not in log.read_text(), log.read_text()
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(60) == 0, log.read_text()
    finally:
        if sup.poll() is None:
            sup.kill()


def test_settings_that_can_never_work_are_usage_errors_before_any_start(monkeypatch):
    """A value that would make every probe fail (a zero timeout killed a healthy server every 40 s), or
    that the supervisor reads of the server's own arguments and would crash on, is refused at once,
    named, exit 2: not a restart loop, not a traceback."""
    cases = [
        ((), {"VOXCPM_PROBE_TIMEOUT": "0"}, "--probe-timeout must be a positive number of seconds, got 0"),
        (("--probe-timeout", "nan"), {}, "--probe-timeout must be a positive number of seconds, got nan"),
        (("--start-timeout", "-1"), {}, "--start-timeout must be a positive number of seconds, got -1"),
        (("--companion-grace", "0"), {}, "--companion-grace must be a positive number of seconds, got 0"),
        (("--probe-interval", "-2"), {}, "--probe-interval must be a non-negative number of seconds, got -2"),
        ((), {"VOXCPM_PROBE_FAILURES": "0"}, "--probe-failures must be 1 or more, got 0"),
        (("--", "tritonserver", "--exit-timeout-secs=abc"), {},
         "tritonserver --exit-timeout-secs must be a whole number of seconds (0-2147483647), got 'abc'"),
        (("--", "tritonserver", "--exit-timeout-secs=2147483648"), {},
         "tritonserver --exit-timeout-secs must be a whole number of seconds (0-2147483647), got '2147483648'"),
        (("--", "tritonserver", "--http-port=70000"), {}, "tritonserver --http-port must be a port number (0-65535), "
                                                          "got '70000'"),
        (("--", "tritonserver", "--grpc-port", "abc"), {}, "tritonserver --grpc-port must be a port number"),
    ]
    for args, env, message in cases:
        args = args if "--" in args else (*args, "--", "true")
        p = subprocess.run([sys.executable, str(REPO / "scripts" / "supervise.py"), *args],
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, (args, env, p.stderr)
    # a gateway drain the gateway itself refuses is not blamed on a flag nobody gave: the default stands
    for drain, grace in (("20", "25"), ("2.5", "7.5"), ("-30", "25"), ("0", "25"), ("soon", "25")):
        monkeypatch.setenv("VOXCPM_OPENAI_SHUTDOWN_TIMEOUT", drain)
        assert cli.companion_grace() == grace, drain


@pytest.mark.parametrize("tmpdir", ["short", "long"])
def test_what_a_killed_companion_leaves_in_its_temporary_directory_goes_once_its_processes_have(tmp_path, tmpdir):
    """Each start of a companion gets a TMPDIR in the supervisor's state directory. One killed by
    SIGKILL leaves what it made there (the gateway: its forkserver's socket directory); the supervisor
    removes it once the companion's process group is gone, and the rest when it stops. Where that
    TMPDIR would make multiprocessing's socket paths too long for AF_UNIX (the gateway's uploads would
    fail), the companion keeps the supervisor's own, and the log says what that leaves."""
    import shutil
    import signal
    import tempfile

    from tests.server import free_port

    starts = tmp_path / "companion.starts"
    script = tmp_path / "companion.py"  # makes a directory as multiprocessing does, and a child that outlives it a moment
    script.write_text(f"""import os, subprocess, tempfile, time
d = tempfile.mkdtemp(prefix="pymp-")
subprocess.Popen(["sleep", "1"])
open({str(starts)!r}, "a").write(f"{{os.getpid()}} {{d}}\\n")
time.sleep(300)
""")
    # pytest's tmp_path is itself too long for the nested one
    tmp = tempfile.mkdtemp(prefix="vx", dir="/tmp") if tmpdir == "short" else str(tmp_path / ("x" * 40))
    os.makedirs(tmp, exist_ok=True)
    log = tmp_path / "supervise.log"
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=tmp)
    with open(log, "w") as f:
        sup = subprocess.Popen([sys.executable, str(REPO / "scripts" / "supervise.py"), "--companion",
                                f"{sys.executable} {script}", "--", sys.executable, "-c", "import time; time.sleep(300)",
                                f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                                f"--metrics-port={free_port()}"], env=env, stderr=f)

    def started():
        return [line.split() for line in starts.read_text().splitlines()] if starts.exists() else []

    def wait_until(check, what):
        deadline = time.monotonic() + 30
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        wait_until(lambda: len(started()) == 1, "the companion's start")
        [(pid, first)] = started()
        [state] = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith(leftovers.STATE_PREFIX)]
        if tmpdir == "long":
            assert os.path.dirname(first) == tmp
            assert f"its TMPDIR stays {tmp}: one in {state} would make its socket paths too long" in log.read_text()
        else:
            assert os.path.dirname(os.path.dirname(first)) == state
            os.kill(int(pid), signal.SIGKILL)
            wait_until(lambda: len(started()) == 2, "the companion's restart")
            wait_until(lambda: not os.path.exists(os.path.dirname(first)), f"{first} removed")
            second = started()[1][1]
            assert os.path.isdir(second) and os.path.dirname(second) != os.path.dirname(first)
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(60) == 0
        assert not os.path.exists(state)
    finally:
        if sup.poll() is None:
            sup.kill()
        if tmpdir == "short":
            shutil.rmtree(tmp, ignore_errors=True)


def test_a_bad_setting_in_the_environment_is_a_usage_error_naming_it():
    """Named by its variable too (argparse's "invalid int value" named only the option nobody gave);
    serve.sh's run without supervision (--print-restricted) is not refused over a probe setting."""
    env = dict(os.environ, VOXCPM_MAX_FAILED_STARTS="five", VOXCPM_PROBE_INTERVAL="abc")
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "supervise.py"), "--", "true"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "argument --probe-interval: not a number: 'abc' (given, or from " \
        "VOXCPM_PROBE_INTERVAL)" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "supervise.py"), "--print-restricted", "--",
                        "tritonserver"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.splitlines()[0] == "tritonserver", p.stderr


def test_the_supervisor_reads_the_servers_ports_as_triton_does():
    """Both option spellings, the last one winning; the metrics address defaults to the HTTP one; an
    endpoint turned off is not checked; bracketed and evhtp-style IPv6 addresses."""
    found = server_args.endpoints(["tritonserver", "--http-address=127.0.0.1", "--http-port", "9000", "--grpc-address",
                              "[::]", "--grpc-port=1", "--grpc-port=2", "--metrics-port", "9002"])
    assert found == [("http", "127.0.0.1", 9000), ("grpc", "::", 2), ("metrics", "127.0.0.1", 9002)]
    assert server_args.endpoints(["t", "--allow-http=false", "--allow-metrics", "false", "--grpc-address=ipv6:::1"]) == [
        ("grpc", "::1", 8001)]


def test_only_a_port_in_use_counts_as_taken():
    """EADDRINUSE is another process's listener; an address this host does not have is the server's
    own error to report, not a reason to wait."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert ports.taken([("http", "127.0.0.1", port), ("grpc", "0.0.0.0", port)]) == [
            f"http 127.0.0.1:{port}", f"grpc 0.0.0.0:{port}"]
    assert ports.taken([("http", "127.0.0.1", port)]) == []  # closed: free again
    assert ports.taken([("http", "192.0.2.1", port), ("grpc", "no-such-host.invalid", port)]) == []


def test_the_supervisor_does_not_start_a_server_on_a_port_another_process_holds(tmp_path):
    """Another server on the HTTP port would answer the readiness checks and probes for this one: the
    supervisor does not start while the port is held (a stopping server's drain), naming it, and gives
    up once it has been held longer than a start may take."""
    import socket

    from tests.server import free_port

    marker = tmp_path / "started"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        companion = f"{sys.executable} -c \"open({str(tmp_path / 'companion')!r}, 'w')\""
        p = _supervise(tmp_path, f"open({str(marker)!r}, 'w')", f"--http-port={port}", "--http-address=127.0.0.1",
                       f"--grpc-port={free_port()}", f"--metrics-port={free_port()}",
                       opts=("--start-timeout", "3", "--companion", companion, "--port-hint", "set X for another"))
    assert p.returncode == 1, p.stderr
    assert not marker.exists(), "a server was started on a port another process holds"
    assert not (tmp_path / "companion").exists(), "its gateway was started beside a server that is not"
    said = (f"not starting: port in use by another process: http 127.0.0.1:{port} (checking every 2-2.5 s; "
            "set X for another)")
    assert p.stderr.count(said) == 1, p.stderr  # said once, not every 2 s
    assert re.search(rf"giving up: port in use by another process: http 127.0.0.1:{port}, for \d+ s; set X for "
                     r"another\n", p.stderr), p.stderr


def test_a_second_supervisor_does_not_start_while_the_first_ones_server_loads(tmp_path):
    """Triton listens only once its models have loaded: a second supervisor on the same ports found
    them free meanwhile, started a server of its own and took the first one's readiness for its own (an
    operator's probe). The first supervisor's claim on the ports keeps the second waiting, naming it;
    the claim goes with the first supervisor."""
    from tests.server import free_port

    endpoints = [f"--http-port={free_port()}", "--http-address=127.0.0.1", f"--grpc-port={free_port()}",
                 f"--metrics-port={free_port()}"]
    loading, second = tmp_path / "loading", tmp_path / "second"
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=str(tmp_path))
    first = subprocess.Popen([sys.executable, str(REPO / "scripts" / "supervise.py"), "--", sys.executable, "-c",
                              f"import time; open({str(loading)!r}, 'w'); time.sleep(120)", *endpoints],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not loading.exists():
            assert time.monotonic() < deadline and first.poll() is None, "the first server did not start"
            time.sleep(0.1)
        p = _supervise(tmp_path, f"open({str(second)!r}, 'w')", *endpoints, opts=("--start-timeout", "3"))
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert p.returncode == 1 and not second.exists(), p.stderr
    assert re.search(r"giving up: port in use by another process: http 127\.0\.0\.1:\d+ \(another supervisor's "
                     r"server\), grpc .*, for \d+ s\n", p.stderr), p.stderr  # (no --port-hint: none)
    claims, held = ports.claim([("http", "127.0.0.1", int(endpoints[0].split("=")[1]))])
    assert len(claims) == 1 and held == []  # released at its end
    claims[0].close()


def test_port_claims_conflict_on_one_address_or_a_wildcard_only(monkeypatch):
    """Two servers may share a port number on two addresses; a wildcard takes the port on every one. A
    port listed twice by one supervisor is one claim (it waited for itself)."""
    import socket

    from tests.server import free_port

    port = free_port()
    one, held = ports.claim([("http", "127.0.0.1", port), ("companion", "127.0.0.1", port)])
    assert len(one) == 1 and held == []
    two, held = ports.claim([("http", "127.0.0.2", port)])
    assert len(two) == 1 and held == []
    assert ports.claim([("http", "127.0.0.1", port)]) == ([], ["http 127.0.0.1:%d (another supervisor's "
                                                                      "server)" % port])
    claims, held = ports.claim([("grpc", "0.0.0.0", port)])
    assert claims == [] and held == [f"grpc 0.0.0.0:{port} (another supervisor's server, on 127.0.0.1, 127.0.0.2)"]
    for s in one + two:
        s.close()
    every, held = ports.claim([("grpc", "::", port)])
    assert len(every) == 1 and held == []
    claims, held = ports.claim([("http", "127.0.0.3", port)])
    assert claims == [] and held == [f"http 127.0.0.3:{port} (another supervisor's server, on *)"]
    assert ports.claim([("http", "0.0.0.0", port)])[0] == []  # :: and 0.0.0.0 are one wildcard
    every[0].close()
    claims, held = ports.claim([("http", "127.0.0.3", port)])
    assert len(claims) == 1 and held == []
    claims[0].close()
    # one address however it is spelled (localhost resolves to 127.0.0.1, and maybe ::1 too)
    one, held = ports.claim([("http", "127.0.0.1", port)])
    assert len(one) == 1 and held == []
    for spelling in ("localhost", "127.1", "127.000.000.001"):
        assert ports.claim([("http", spelling, port)])[0] == [], spelling
    one[0].close()
    v6, held = ports.claim([("http", "::1", port)])
    assert held == [] and ports.claim([("http", "0:0:0:0:0:0:0:1", port)])[0] == []
    for s in v6:
        s.close()
    # a name that does not resolve could be any address: it takes the port on every one
    def unresolved(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(ports.socket, "getaddrinfo", unresolved)
    assert ports._addresses("triton.example") == {"*"}


def test_the_supervisor_waits_for_its_companions_port_before_the_first_start_only(tmp_path):
    """A foreign process on the gateway's port: Triton was loaded, the gateway failed five times and
    everything stopped (an operator's probe); now nothing starts while it holds the port. Once started,
    the companion holds that port itself, across the server's restarts, which do not wait for it."""
    import socket

    from tests.server import free_port

    triton = [f"--http-port={free_port()}", "--http-address=127.0.0.1", f"--grpc-port={free_port()}",
              f"--metrics-port={free_port()}"]
    marker = tmp_path / "starts"
    server = f"open({str(marker)!r}, 'a').write('x'); import time; time.sleep(0.5); raise SystemExit(3)"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        p = _supervise(tmp_path, server, *triton, opts=("--start-timeout", "3", "--companion-port", f"127.0.0.1:{port}"))
    assert p.returncode == 1 and not marker.exists(), p.stderr
    assert f"not starting: port in use by another process: companion 127.0.0.1:{port}" in p.stderr, p.stderr
    port = free_port()
    companion = (f"{sys.executable} -c \"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); "
                 "s.listen(); time.sleep(120)\"")
    p = _supervise(tmp_path, server, *triton, opts=("--start-timeout", "3", "--max-failed-starts", "2", "--companion",
                                                    companion, "--companion-port", f"127.0.0.1:{port}"))
    assert p.returncode == 1 and marker.read_text() == "xx", p.stderr  # restarted beside its companion
    assert "port in use" not in p.stderr, p.stderr


def test_a_server_that_dies_while_loading_leaves_no_shared_memory_region(tmp_path):
    """Regions are noted while the server loads too, so one that dies before it is ready, its model
    processes with it, has their regions removed like one that was ready (once they are gone, nothing
    names them any more)."""
    from tests.server import free_port

    name = f"voxcpm_test_region_{os.getpid()}_{time.monotonic_ns()}"
    path = os.path.join(leftovers.SHM_DIR, name)
    server = f"import os, time; open({path!r}, 'w'); time.sleep(2.5); os._exit(1)"
    try:
        p = _supervise(tmp_path, server, name, f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                       f"--metrics-port={free_port()}", "--backend-config=python,shm-region-prefix-name=voxcpm_test_",
                       opts=("--max-failed-starts", "1"))
        assert p.returncode == 1 and "the last: tritonserver exited with code 1" in p.stderr, p.stderr
        assert not os.path.exists(path), p.stderr
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_a_region_made_before_any_command_line_named_it_goes_with_its_server_and_no_other_servers(tmp_path):
    """A server stopped while it starts a model process can leave the region it made for it, named on
    no command line yet (a review's serve.sh stopped during start-up leaked one in five tries). The
    supervisor gives its server a region prefix of its own, and once the server has stopped removes
    every region of that prefix; another server's (the default prefix, mapped or not, maybe in another
    container sharing /dev/shm) is never touched."""
    from tests.server import free_port

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    other = os.path.join(leftovers.SHM_DIR, f"triton_python_backend_shm_region_{tag}_other")
    made = tmp_path / "made"
    server = ("import os, sys, time; "
              "flag = '--backend-config=python,shm-region-prefix-name='; "
              "prefix = next(a[len(flag):] for a in sys.argv if a.startswith(flag)); "
              f"path = os.path.join({leftovers.SHM_DIR!r}, prefix + {tag!r}); open(path, 'w').write('x'); "
              f"open({other!r}, 'w').write('x'); open({str(made)!r}, 'w').write(path); "
              "time.sleep(2.5); os._exit(1)")
    try:
        p = _supervise(tmp_path, server, f"--http-port={free_port()}", f"--grpc-port={free_port()}",
                       f"--metrics-port={free_port()}", opts=("--max-failed-starts", "1"))
        assert p.returncode == 1 and "the last: tritonserver exited with code 1" in p.stderr, p.stderr
        unnamed = made.read_text()
        assert server_args.OWN_PREFIX.match(os.path.basename(unnamed)), unnamed
        assert not os.path.exists(unnamed), p.stderr
        assert os.path.exists(other), "another server's region is left alone"
    finally:
        for path in [other] + ([made.read_text()] if made.exists() else []):
            if os.path.exists(path):
                os.unlink(path)


def test_a_killed_supervisors_directory_and_its_servers_regions_go_once_nothing_of_it_runs(tmp_path):
    """SIGKILL leaves a supervisor's state directory in the temporary directory and, when its server is
    killed too, the server's shared-memory regions in /dev/shm. Where its guard was killed as well, the
    next supervisor to start removes both, but not while the killed one's server still runs (it drains after its SIGTERM), and never a
    live supervisor's directory."""
    import glob
    import signal
    import uuid

    from tests.server import free_port

    def endpoints():
        return [f"--http-port={free_port()}", f"--grpc-port={free_port()}", f"--metrics-port={free_port()}"]

    def state_dirs():
        return sorted(glob.glob(str(tmp_path / f"{leftovers.STATE_PREFIX}*")))

    def wait_until(check, what):
        deadline = time.monotonic() + 30
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    region = f"voxcpm_test_{uuid.uuid4().hex}"
    marker = tmp_path / "server.pid"
    # a server still draining when its supervisor dies: the death signal (SIGTERM) does not stop it
    draining = (f"import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"open('/dev/shm/' + sys.argv[1], 'w').close(); open({str(marker)!r}, 'w').write(str(os.getpid())); "
                f"time.sleep(300)")
    env = dict(os.environ, VOXCPM_PROBE_INTERVAL="0", TMPDIR=str(tmp_path))
    cmd = [sys.executable, str(REPO / "scripts" / "supervise.py"), "--", sys.executable, "-c"]
    killed = subprocess.Popen([*cmd, draining, region, *endpoints(), "--backend-config=python,shm-region-prefix-name=voxcpm_test_"],
                              env=env, stderr=subprocess.DEVNULL)
    alive = None
    try:
        wait_until(lambda: state_dirs() and region in leftovers.recorded_regions(state_dirs()[0]),
                   "the supervisor noted its server's region")
        [killed_dir] = state_dirs()
        alive = subprocess.Popen([*cmd, "import time; time.sleep(300)", *endpoints()], env=env, stderr=subprocess.DEVNULL)
        wait_until(lambda: len(state_dirs()) == 2, "the second supervisor's state directory")
        [alive_dir] = [d for d in state_dirs() if d != killed_dir]
        # its guard too (it would clear up as the next supervisor does: that is tested above)
        [guard_pid] = [p for p in _children(killed.pid) if guard.__name__ in groups.command_line(p)]
        os.kill(guard_pid, signal.SIGKILL)
        killed.kill()
        killed.wait(10)
        server = int(marker.read_text())

        p = _supervise(tmp_path, "raise SystemExit(3)", *endpoints(), opts=("--max-failed-starts", "1"))
        assert "killed supervisor" not in p.stderr, p.stderr
        assert state_dirs() == sorted([killed_dir, alive_dir]) and os.path.exists(f"/dev/shm/{region}")

        os.kill(server, signal.SIGKILL)
        wait_until(lambda: not processes.process_alive(server), "the server's end")
        p = _supervise(tmp_path, "raise SystemExit(3)", *endpoints(), opts=("--max-failed-starts", "1"))
        assert (f"removed what 1 killed supervisor(s) left: {killed_dir}, and 1 shared-memory region(s) of "
                "their servers") in p.stderr, p.stderr
        assert state_dirs() == [alive_dir] and not os.path.exists(f"/dev/shm/{region}")

        alive.send_signal(signal.SIGTERM)
        assert alive.wait(30) == 0
        assert state_dirs() == []
    finally:
        for proc in (killed, alive):
            if proc is not None and proc.poll() is None:
                proc.kill()
        if marker.exists() and processes.process_alive(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)
        if os.path.exists(f"/dev/shm/{region}"):
            os.unlink(f"/dev/shm/{region}")


def test_a_sweep_finishes_what_a_dead_sweep_left_and_takes_nothing_it_cannot_lock(tmp_path, monkeypatch):
    """A sweep that died while removing a state directory left it renamed `<dir>.removing-<its pid>`:
    the next one finishes it, regions named in it included, unless that sweep still runs. Where the
    filesystem has no locks a state directory gets no `held` file, so no sweep takes it, and a lock
    that cannot be tried leaves a directory too."""
    import errno
    import fcntl
    import uuid

    gone = subprocess.Popen(["true"])
    gone.wait()
    region = f"voxcpm_test_{uuid.uuid4().hex}"
    dead, running = tmp_path / f"{leftovers.STATE_PREFIX}abc.removing-{gone.pid}", \
        tmp_path / f"{leftovers.STATE_PREFIX}def.removing-{os.getpid()}"
    for d in (dead, running):
        (d / "run-x").mkdir(parents=True)
        (d / leftovers.REGIONS_FILE).write_bytes(f"{region}\n".encode() + b"\xff damaged\n")
    open(f"/dev/shm/{region}", "w").close()
    try:
        assert leftovers.remove_abandoned_state_dirs(str(tmp_path)) == ([str(dead)], [region])
        assert not dead.exists() and running.exists() and not os.path.exists(f"/dev/shm/{region}")
    finally:
        if os.path.exists(f"/dev/shm/{region}"):
            os.unlink(f"/dev/shm/{region}")

    unheld = tmp_path / f"{leftovers.STATE_PREFIX}ghi"
    unheld.mkdir()
    (unheld / run_state.HELD_FILE).write_text("")

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(leftovers.tempfile, "tempdir", str(tmp_path))
    path, fd = leftovers.make_state_dir()
    assert fd is None and os.listdir(path) == []
    assert leftovers.remove_abandoned_state_dirs(str(tmp_path)) == ([], []) and unheld.exists()


def test_only_the_default_run_directories_of_servers_that_exited_are_removed(tmp_path, monkeypatch):
    """run_state.remove_stale_run_dirs: a directory named for a pid that is gone, a zombie, or a pid now
    another process's (another start time) goes, contents and all, unless a live process holds it (a
    server in another pid namespace sharing /tmp); one of a running server, one whose process cannot be
    read, another user's, anything not named as run_dir() names them, and what is not a directory (a
    file, a link to one) stay. What a sweep that died left half removed (renamed `.removing-<its pid>`)
    goes too, unless that sweep still runs; a damaged region note in it breaks nothing."""
    me, my_start = os.getpid(), processes.proc_fields(os.getpid())[19]
    gone = subprocess.Popen(["true"])
    gone.wait()
    zombie = subprocess.Popen(["true"])  # exited, not yet reaped
    deadline = time.monotonic() + 10
    while processes.proc_fields(zombie.pid)[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    zombie_start = processes.proc_fields(zombie.pid)[19]
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "kept").write_text("x")
    stale = [f"voxcpm-{gone.pid}-12345", f"voxcpm-{gone.pid}", f"voxcpm-{zombie.pid}-{zombie_start}",
             f"voxcpm-{me}-{int(my_start) + 1}"]
    held = f"voxcpm-{gone.pid}-99"
    kept = [f"voxcpm-{me}-{my_start}", f"voxcpm-{me}", "voxcpm-run-abc123", f"voxcpm-{gone.pid}-x", "other",
            f"voxcpm-{gone.pid}-6.removing-{me}"]
    half_removed = f"voxcpm-{gone.pid}-5.removing-{gone.pid}"
    for name in stale + kept + [held, half_removed]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "internal.key").write_text("secret")
    (tmp_path / half_removed / f"{run_state.REGION_NOTE}1").write_bytes(b"\xff\xfe not a region")
    (tmp_path / held / run_state.HELD_FILE).write_text("")
    (tmp_path / f"voxcpm-{gone.pid}-7").write_text("a file")
    (tmp_path / f"voxcpm-{gone.pid}-8").symlink_to(target)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); time.sleep(60)",
         str(tmp_path / held / run_state.HELD_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with monkeypatch.context() as m:  # nothing of another user's, nor of a server it cannot read
            m.setattr(os, "getuid", lambda: os.geteuid() + 1)
            assert run_state.remove_stale_run_dirs(str(tmp_path)) == []
        with monkeypatch.context() as m:
            m.setattr(processes, "proc_fields", lambda pid: (_ for _ in ()).throw(PermissionError(pid)))
            assert run_state.remove_stale_run_dirs(str(tmp_path)) == []
        removed = run_state.remove_stale_run_dirs(str(tmp_path))
    finally:
        zombie.wait()
        holder.kill()
        holder.wait()
    assert sorted(removed) == sorted(str(tmp_path / n) for n in stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        kept + [held, "elsewhere", f"voxcpm-{gone.pid}-7", f"voxcpm-{gone.pid}-8"])
    assert (target / "kept").exists()
    assert run_state.remove_stale_run_dirs(str(tmp_path)) == [str(tmp_path / held)]  # let go of with its holder
    assert run_state.remove_stale_run_dirs(str(tmp_path / "missing")) == []


def test_thread_stacks_show_where_each_thread_is():
    import threading

    release = threading.Event()

    def parked_in_a_wait():
        release.wait(30)

    t = threading.Thread(target=parked_in_a_wait, name="parked-thread")
    t.start()
    try:
        stacks = processes.thread_stacks()
    finally:
        release.set()
        t.join(10)
    assert "--- thread parked-thread:" in stacks and "parked_in_a_wait" in stacks
    assert "--- thread MainThread:" in stacks


def test_a_stuck_engine_loop_is_reported_with_every_threads_stack_once_per_stall(caplog):
    """The decoder's liveness status: past ENGINE_STUCK_S without a heartbeat it is unhealthy, and
    the first check of that stall logs where every thread is (the next stall logs again)."""
    import types

    from voxcpm_triton.serving import decoder_model

    model = object.__new__(decoder_model.DecoderModel)
    model.engine = types.SimpleNamespace(heartbeat=time.monotonic(), status=lambda: None)
    model.audio, model._stuck_logged = None, None
    model.vox = types.SimpleNamespace(device=torch.device("cpu"))
    assert model._status() is None
    model.engine.heartbeat = time.monotonic() - decoder_model.ENGINE_STUCK_S - 5
    with caplog.at_level("ERROR", logger="voxcpm_triton.decoder"):
        for _ in range(3):
            assert "the engine loop has not come round for" in model._status()
    dumps = [r for r in caplog.records if "threads:" in r.getMessage()]
    assert len(dumps) == 1 and "--- thread MainThread:" in dumps[0].getMessage()
    model.engine.heartbeat = time.monotonic() - decoder_model.ENGINE_STUCK_S - 1  # a new stall
    with caplog.at_level("ERROR", logger="voxcpm_triton.decoder"):
        model._status()
    assert len([r for r in caplog.records if "threads:" in r.getMessage()]) == 2


def test_an_audio_round_stuck_past_the_limit_makes_the_decoder_unhealthy(caplog):
    """A send the audio thread never comes back from (a response to a caller whose process died)
    leaves the engine loop running: the round's age is what shows it."""
    import types

    from voxcpm_triton.serving import decoder_model

    model = object.__new__(decoder_model.DecoderModel)
    model.engine = types.SimpleNamespace(heartbeat=time.monotonic(), status=lambda: None)
    model.audio = types.SimpleNamespace(thread=types.SimpleNamespace(is_alive=lambda: True), round_since=None)
    model._stuck_logged = None
    assert model._status() is None
    model.audio.round_since = time.monotonic() - 1  # a round under way
    assert model._status() is None
    model.audio.round_since = time.monotonic() - decoder_model.ENGINE_STUCK_S - 5
    with caplog.at_level("ERROR", logger="voxcpm_triton.decoder"):
        for _ in range(2):
            assert "the decoder's audio thread has been in one round for" in model._status()
    assert len([r for r in caplog.records if "threads:" in r.getMessage()]) == 1


def test_a_stuck_engine_loops_log_line_says_which_cuda_streams_have_not_finished(caplog, monkeypatch):
    """On a GPU the stall's log line tells a hang on the device (a stream's work not finished) from
    one on the host; a failing query does not break the status check."""
    import types

    from voxcpm_triton.serving import decoder_model

    model = object.__new__(decoder_model.DecoderModel)
    model.engine = types.SimpleNamespace(heartbeat=time.monotonic() - decoder_model.ENGINE_STUCK_S - 5,
                                         status=lambda: None)
    model.vox = types.SimpleNamespace(device=torch.device("cuda", 0))
    model.audio = types.SimpleNamespace(cuda_stream=types.SimpleNamespace(query=lambda: True))
    model._stuck_logged = None
    monkeypatch.setattr(decoder_model.torch.cuda, "default_stream",
                        lambda device: types.SimpleNamespace(query=lambda: False))
    with caplog.at_level("ERROR", logger="voxcpm_triton.decoder"):
        assert "has not come round" in model._status()
    line = [r.getMessage() for r in caplog.records if "threads:" in r.getMessage()]
    assert len(line) == 1 and "(GPU work finished: engine stream NO, audio stream yes)" in line[0], line

    def broken(device):
        raise RuntimeError("no driver")

    monkeypatch.setattr(decoder_model.torch.cuda, "default_stream", broken)
    model.engine.heartbeat -= 1  # a new stall: logged again
    with caplog.at_level("ERROR", logger="voxcpm_triton.decoder"):
        assert "has not come round" in model._status()
    assert "(GPU state unknown: no driver)" in caplog.records[-1].getMessage()


def test_a_crashing_model_process_leaves_its_threads_stacks(tmp_path):
    """Triton 2.51 reports a dead stub only as 'not healthy': the stacks in its log say where."""
    code = ("import os, signal, threading\n"
            "from voxcpm_triton.coordination import runtime\n"
            "runtime.model_process()\n"
            "threading.Thread(target=lambda: threading.Event().wait(), name='bls-responses', daemon=True).start()\n"
            "os.kill(os.getpid(), signal.SIGSEGV)\n")
    env = dict(os.environ, VOXCPM_RUN_DIR=str(tmp_path), PYTHONPATH=str(REPO / "python_backend"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "Fatal Python error: Segmentation fault" in out.stderr and "Thread 0x" in out.stderr, out.stderr


def test_the_supervisor_restarts_on_a_dead_process_at_once_and_on_a_stale_beacon_only_if_it_stays(tmp_path,
                                                                                                  monkeypatch):
    """loop.Supervisor._dead_model reads the server's beacons: a dead process is a restart at
    once; a stale beacon only once it has stayed stale for STALE_CONFIRM_S (beacons carry wall-clock
    times, so a clock step makes every beacon look stale until its next beat), and never before a
    dead process; a run directory gone while the server runs is a restart too."""
    class Opts:
        probe_interval = probe_timeout = probe_failures = start_timeout = 1

    s = loop.Supervisor(["tritonserver"], Opts)
    assert s._dead_model() is None  # no server started yet
    s.server.run_dir = str(tmp_path)
    assert s._dead_model() is None
    beat = {"t": time.time()}
    (tmp_path / f"decoder.{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid(), "beat": beat["t"]}))
    assert s._dead_model() is None
    clock = {"t": 100.0}
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock["t"])
    late = beat["t"] + liveness.BEACON_STALE_S + 5
    monkeypatch.setattr(runtime.time, "time", lambda: late)
    assert s._dead_model() is None  # stale once: not yet
    clock["t"] += loop.STALE_CONFIRM_S
    monkeypatch.setattr(s.server, "health", lambda which: True)
    stale = f"the decoder model process (pid {os.getpid()}) has not answered for {liveness.BEACON_STALE_S + 5:.0f} s"
    assert s._dead_model() == f"model process: {stale}"
    monkeypatch.setattr(s.server, "health", lambda which: which != "live")  # the server itself stalled: it is named
    assert s._dead_model() == f"tritonserver is not answering, nor its model processes that wait on it: {stale}"
    monkeypatch.setattr(s.server, "health", lambda which: True)
    monkeypatch.setattr(runtime.time, "time", lambda: beat["t"])  # fresh again: the wait starts over
    assert s._dead_model() is None and s.stale_since is None
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    (tmp_path / f"tts_stream.{child}.json").write_text(json.dumps({"pid": child, "beat": beat["t"]}))
    assert s._dead_model() == f"model process: the tts_stream model process (pid {child}) has died"
    (tmp_path / f"vae_decoder.{os.getpid()}.json").write_text('{"pid": "x"}')  # garbled: skipped, no crash
    monkeypatch.setattr(runtime.time, "time", lambda: late)  # a stale beacon does not hide a dead process
    assert s._dead_model() == f"model process: the tts_stream model process (pid {child}) has died"
    s.server.run_dir = str(tmp_path / "gone")
    assert s._dead_model() == f"model process: the server's runtime directory {s.server.run_dir} is gone"


def test_the_supervisor_tells_a_stopped_server_from_an_answering_one():
    """TritonServer.health("live"): Triton's live endpoint within 2 s; a server stopped (SIGSTOP) does not answer."""
    import signal

    from tests.server import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/live" else 404); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""", str(port)])
    try:
        s = tritonserver.TritonServer(["tritonserver", f"--http-port={port}", "--http-address=127.0.0.1"])
        deadline = time.monotonic() + 30
        while not s.health("live"):
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.1)
        server.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        assert not s.health("live")
        assert time.monotonic() - t0 < 5
    finally:
        server.kill()
        server.wait(30)


def test_a_probe_cut_short_by_a_dead_process_names_it_and_ends_with_its_server(tmp_path, monkeypatch):
    """A model process that dies while a probe waits ends the wait with the process's reason (not a
    probe's), and the probe's thread, still waiting, is waited for once the server is stopped, so
    that it cannot reach the next server on the same port."""
    class Opts:
        probe_interval = probe_timeout = probe_failures = start_timeout = 1

    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    release = threading.Event()

    def stuck_probe(*args, **kwargs):  # the process dies while the probe's request waits on it
        (run / f"tts_stream.{child}.json").write_text(json.dumps({"pid": child, "beat": time.time()}))
        release.wait(30)
        return probe.UNHEALTHY, "connection reset"

    monkeypatch.setattr(probe, "probe", stuck_probe)
    s = loop.Supervisor(["tritonserver"], Opts)
    run, state = tmp_path / "run", tmp_path / "state"
    run.mkdir()
    state.mkdir()
    s.server.run_dir, s.server.state_dir = str(run), str(state)

    class Running:  # a server that is up and ready
        pid = os.getpid()

        def poll(self):
            return None

    s.server.proc, s.server.started = Running(), time.monotonic()
    monkeypatch.setattr(s.server, "ready", lambda: True)
    t0 = time.monotonic()
    why = s.watch()
    assert why == f"model process: the tts_stream model process (pid {child}) has died"
    assert time.monotonic() - t0 < 5
    thread = s.probe_thread
    assert thread is not None and thread.is_alive()  # the probe still waits on the server
    s.server.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the server stop() ends
    threading.Timer(1.0, release.set).start()  # the probe fails once its server is gone
    s.stop(why, grace=5)
    assert not thread.is_alive() and s.probe_thread is None


@pytest.mark.parametrize("case", ["held", "draining", "busy", "unloading", "finalizing", "foreign_model",
                                  "never_ready"])
def test_a_stopping_server_held_with_every_model_idle_is_ended_early(tmp_path, monkeypatch, case):
    """tritonserver.TritonServer.wait_exit: a stopping server whose model processes all report no
    request and none of which unloads for HELD_IDLE_S is held (Triton 2.51 keeps a model whose gRPC
    stream was cancelled while its last response was written) and is ended then, not at the exit
    timeout, and not before the time its requests were given (their responses may still be on their
    way to a slow reader). Not while a process reports a request, while processes unload one after another, while
    a model process without a beacon runs (one in its finalize), with a model in the repository that
    writes no beacon, or for a server that never became ready."""
    held = 3.0
    monkeypatch.setattr(tritonserver, "HELD_IDLE_S", held)
    repo = tmp_path / "repo"
    for m in ("tts_stream", "decoder") + (("custom",) if case == "foreign_model" else ()):
        (repo / m).mkdir(parents=True)

    s = tritonserver.TritonServer(["tritonserver", f"--model-repository={repo}"])
    assert s.beacons_tell_all == (case != "foreign_model")
    run = tmp_path / "run"
    run.mkdir()
    s.run_dir, s.was_ready = str(run), case != "never_ready"
    me = os.getpid()
    for name, busy in (("tts_stream", 1 if case == "busy" else 0), ("decoder", 0)):
        (run / f"{name}.{me}.json").write_text(json.dumps({"pid": me, "beat": time.time(), "busy": busy}))
    extra = []
    if case == "unloading":  # three more processes, one unloading every 1.5 s
        for i in range(3):
            child = subprocess.Popen(["sleep", "60"])
            extra.append(child)
            (run / f"tts.{child.pid}.json").write_text(json.dumps({"pid": child.pid, "beat": time.time(), "busy": 0}))

        def unload():
            for child in extra:
                time.sleep(1.5)
                (run / f"tts.{child.pid}.json").unlink()
        threading.Thread(target=unload, daemon=True).start()
    stub = "(exec -a triton_python_backend_stub sleep 60) & " if case == "finalizing" else ""
    server = subprocess.Popen(["bash", "-c", f"{stub}exec sleep 60"], start_new_session=True)  # never exits
    try:
        t0 = time.monotonic()
        drain = 4.0 if case == "draining" else 0.0
        why = s.wait_exit(server, 20 if case in ("held", "draining", "unloading") else held + 3, drain)
        took = time.monotonic() - t0
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        for p in [server, *extra]:
            p.kill()
            p.wait()
    if case in ("held", "draining"):
        assert re.fullmatch(r"tritonserver still holds decoder, tts_stream \d+ s after SIGTERM, every model process "
                            r"idle and nothing unloaded for \d+ s \(one known cause: .*\)", why), why
        assert drain + held <= took < drain + held + 2
    elif case == "unloading":  # held once the last one has gone (4.5 s), then `held` more
        assert why.startswith("tritonserver still holds decoder, tts_stream "), why
        assert 4.5 + held <= took < 4.5 + held + 2
    else:
        assert why == "tritonserver did not exit in time" and took >= held + 3


def test_busy_beacons_reads_each_live_process_count(tmp_path):
    """liveness.busy_beacons: a live process's count; none written (an older process) counts as busy;
    a dead process's beacon, a garbled one and other files are left out; no directory: None."""
    me = os.getpid()
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    (tmp_path / f"tts.{me}.json").write_text(json.dumps({"pid": me, "beat": 1.0, "busy": 3}))
    (tmp_path / f"decoder.{me}.json").write_text(json.dumps({"pid": me, "beat": 1.0}))
    (tmp_path / f"tts_stream.{child}.json").write_text(json.dumps({"pid": child, "beat": 1.0, "busy": 0}))
    (tmp_path / "voices.1.json").write_text("{")
    (tmp_path / "stopping").write_text("1")
    assert liveness.busy_beacons(str(tmp_path)) == {f"tts.{me}.json": 3, f"decoder.{me}.json": 1}
    assert liveness.busy_beacons(str(tmp_path / "gone")) is None


def test_a_beacon_counts_its_processs_executes_and_the_work_it_holds_past_them(tmp_path, monkeypatch):
    """A beacon's `busy`: the requests inside counted executes plus its `work` (the decoder's engine
    requests, which outlive its execute); a `work` that fails counts as busy."""
    monkeypatch.setattr(run_state, "run_dir", lambda: str(tmp_path))
    seen = {}

    class Model:
        @liveness.counted
        def execute(self, requests):
            b.write()
            seen.update(json.loads(open(b.path).read()))

    b = liveness.Beacon("decoder", work=lambda: 2)
    try:
        Model().execute([1, 2, 3])
        assert seen["busy"] == 5
        b.write()
        assert json.loads(open(b.path).read())["busy"] == 2
        b.work = lambda: 1 / 0
        b.write()
        assert json.loads(open(b.path).read())["busy"] == 1
    finally:
        b.stop()
