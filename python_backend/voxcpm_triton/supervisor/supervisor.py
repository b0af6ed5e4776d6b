"""The supervision loop: start tritonserver, watch it (readiness, beacons, probes), restart it when
it breaks, stop it and what it left; companions tended beside it."""

from __future__ import annotations

import glob
import http.client
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from ..serving import liveness, runtime
from . import companion, groups, guard, leftovers, ports, probe, server_args
from .log import log

STALE_CONFIRM_S = 3.0  # a beacon found stale must stay so this long (its process beats every second)
BROKEN_GRACE_S = 5.0  # what a server being restarted gets after SIGTERM before SIGKILL
PROBE_JOIN_S = 5.0  # what a probe cut short gets to end once its server is gone
HELD_IDLE_S = 5.0  # a stopping server whose model processes all stay idle and loaded this long is held
DEAD_MODEL = "dead model"  # _probe's status when a model process was found dead while it ran


class Supervisor:
    def __init__(self, command: list[str], opts):
        self.opts = opts
        self.companion_argvs = [shlex.split(c) for c in getattr(opts, "companion", None) or []]
        self.companions: list[companion.Companion] = []  # made by run(), with the state directory
        self.args = server_args.restricted(command)
        self.ports = server_args.endpoints(self.args)
        _, host, port = next((p for p in self.ports if p[0] == "http"), ("http", "127.0.0.1", 8000))
        self.url = ports.url(host, port)
        metrics = next((p for p in self.ports if p[0] == "metrics"), None)
        self.metrics_url = ports.url(*metrics[1:]) if metrics else None  # a probe queued behind work counts as alive
        self.exit_timeout = float(server_args.option(self.args, "exit-timeout-secs", "30"))
        self.beacons_tell_all = server_args.only_beacon_models(self.args)  # see _wait_exit
        # the companions' own ports: a start waits for them too (a gateway that cannot listen would
        # fail its starts beside a server that had loaded for nothing)
        self.ports += [("companion", *ports.host_port(a)) for a in getattr(opts, "companion_port", None) or []]
        if not self.beacons_tell_all:
            log("the model repository has models of its own (or cannot be read): a stopping server is left "
                "its whole exit timeout, never judged held")
        self.proc: subprocess.Popen | None = None
        self.guard: subprocess.Popen | None = None  # guard.py, beside the server
        self.run_dir: str | None = None
        self.stale_since: float | None = None  # when a stale beacon was first seen (_dead_model)
        self.probe_thread: threading.Thread | None = None  # the last probe's (_probe)
        self.envs_before: set[str] = set()  # the python backend's directories before this server started
        self.python_env: str | None = None  # and the one it made, if known
        self.state_dir: str | None = None  # the runs' parent, kept across restarts
        self.held_fd: int | None = None  # its `held` file, locked (leftovers.make_state_dir)
        self.shm_prefix = server_args.shm_prefix(self.args)
        self.regions: set[str] = set()  # the running server's model processes' shared-memory regions
        self.was_ready = self.was_healthy = False  # the current server: became ready, passed a probe
        self.stopping = False
        self.started_once = False  # companions start with the first server
        self.fatal: str | None = None  # why the supervisor gives up (exit 1)

    # ------------------------------------------------------------------ one server
    def start(self):
        if self.state_dir is None:
            self.state_dir, self.held_fd = leftovers.make_state_dir()
        self.run_dir = tempfile.mkdtemp(prefix="run-", dir=self.state_dir)
        # VOXCPM_SUPERVISOR_PID: killed (SIGKILL), it cannot write `stopping`; the models then end their
        # requests themselves before tritonserver's forced exit (voxcpm_triton.serving.runtime.stop_deadline)
        env = dict(os.environ, VOXCPM_RUN_DIR=self.run_dir, VOXCPM_STATE_DIR=self.state_dir,
                   VOXCPM_SUPERVISOR_PID=str(os.getpid()))
        if not env.get("VOXCPM_INTERNAL_KEY"):
            env["VOXCPM_INTERNAL_KEY"] = secrets.token_hex(32)
        self.envs_before, self.python_env = set(glob.glob(leftovers.PYTHON_ENV_GLOB)), None
        self.proc = groups.spawn(self.args, env, self.held_fd)
        # what is left of the server if this process is killed (guard.py)
        self.guard = subprocess.Popen([sys.executable, "-m", guard.__name__, str(self.proc.pid), str(os.getpid()),
                                       str(self.exit_timeout), self.shm_prefix], cwd=guard.IMPORT_ROOT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.started, self.started_once = time.monotonic(), True
        self.was_ready = self.was_healthy = False
        self.stale_since = None
        log(f"tritonserver started (pid {self.proc.pid})")

    def stop(self, why: str, grace: float | None = None):
        """SIGTERM, wait `grace` (default: the server's exit timeout plus slack), then SIGKILL what is
        left of its group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.monotonic()
        self._note_regions(groups.commands_of(proc.pid))
        if proc.poll() is None:
            log(f"stopping tritonserver ({why})")
            drain = self.exit_timeout / 2 if grace is None else 0.0
            self._end_requests_by(time.time() + drain)
            proc.send_signal(signal.SIGTERM)
            late = self._wait_exit(proc, self.exit_timeout + 10 if grace is None else grace, drain)
            if late:
                log(f"{late}: SIGKILL")
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        left = groups.wait(proc.pid, 5)  # model processes end on their own once the server is gone
        if left:
            log(f"killing {len(left)} leftover process(es) of the server: {left}")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        left = groups.wait(proc.pid, 5)  # killed processes take a moment to go
        self._end_probe()
        self._end_guard()
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if left:
            log("some of the server's processes are still there: its shared-memory regions are left")
        else:
            self._remove_regions()
            if self.python_env:  # a server killed, or out of its exit timeout, leaves its (empty) directory
                try:
                    os.rmdir(self.python_env)
                except OSError:
                    pass  # gone with a clean exit, or not empty: not ours to clear
        log(f"tritonserver stopped in {time.monotonic() - t0:.1f} s (exit code {proc.returncode})")

    def _end_guard(self):
        """The stopped server's guard ends by itself once the server's group is empty; else it is killed."""
        proc, self.guard = self.guard, None
        if proc is None:
            return
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _wait_exit(self, proc: subprocess.Popen, seconds: float, drain: float = 0.0) -> str | None:
        """Wait up to `seconds` for a stopping server to exit; None if it did, else why to kill it:
        out of time, or held. Held: past `drain` (the time its requests were given: a request's
        responses may still be on their way to a slow reader, which keeps its model loaded), every
        model process left has reported no request for HELD_IDLE_S and none has unloaded or been
        unloading meanwhile (a process in its finalize has no beacon any more), so Triton is waiting
        for something that never ends. A gRPC stream cancelled while its last response is being
        written leaves Triton 2.51 holding that model for good, and the server would otherwise wait
        out its exit timeout (then exit 1). Only for a repository of this project's models, which all
        write beacons."""
        start = time.monotonic()
        end = start + seconds
        idle, idle_since = None, 0.0
        while True:
            try:
                proc.wait(max(0.0, min(0.5, end - time.monotonic())))
                return None
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= end:
                return "tritonserver did not exit in time"
            # not judged: a server stopped while it loads (models without a beacon yet)
            watch = self.run_dir and self.beacons_tell_all and self.was_ready
            beacons = liveness.busy_beacons(self.run_dir) if watch else None
            if not beacons or any(beacons.values()) or self._stubs_without_beacon(proc.pid, beacons):
                idle = None  # working, or a process finalizing (its beacon goes as its finalize starts)
            elif set(beacons) != idle:
                idle, idle_since = set(beacons), max(now, start + drain)
            elif now - idle_since >= HELD_IDLE_S:
                models = sorted({name.partition(".")[0] for name in idle})
                return (f"tritonserver still holds {', '.join(models)} {now - start:.0f} s after SIGTERM, every "
                        f"model process idle and nothing unloaded for {now - idle_since:.0f} s (one known cause: "
                        "a gRPC stream cancelled while its last response was being written)")

    def _note_python_env(self, commands: dict[int, list[str]]):
        """The python backend's directory this server made: the one that appeared since its start, if
        only one did (another server may have started meanwhile). Only once a model process of the
        server runs (the backend makes the directory before any): before, or in a server without
        python models, the one new directory may be another server's, which would be removed under it
        (Triton aborts at its exit when its directory is gone)."""
        if not groups.stub_pids(commands):
            return
        made = set(glob.glob(leftovers.PYTHON_ENV_GLOB)) - self.envs_before
        self.python_env = made.pop() if len(made) == 1 else None

    @staticmethod
    def _stubs_without_beacon(pgid: int, beacons: dict[str, int]) -> bool:
        """True if a model process of the server writes no beacon (anymore): one in its finalize."""
        with_beacon = {name.split(".")[1] for name in beacons}
        return any(str(pid) not in with_beacon for pid in groups.stub_pids(groups.commands_of(pgid)))

    def _end_probe(self):
        """A probe cut short (a model process died meanwhile) fails once its server is gone; wait for it,
        so that it cannot reach the next server on the same port."""
        t, self.probe_thread = self.probe_thread, None
        if t is not None and t.is_alive():
            t.join(PROBE_JOIN_S)
            if t.is_alive():
                log(f"a probe of the stopped server is still running after {PROBE_JOIN_S:g} s")

    def _note_regions(self, commands: dict[int, list[str]]):
        """Add the regions the server's processes name now (`commands`: groups.commands_of); keep the list in
        the state directory, where the next supervisor finds it if this one and the server are killed
        (leftovers.remove_abandoned_state_dirs)."""
        new = leftovers.shm_regions(commands, self.shm_prefix) - self.regions
        if new:
            self.regions |= new
            self._save_regions()

    def _save_regions(self):
        try:
            leftovers.record_regions(self.state_dir, self.regions)
        except OSError as e:
            log(f"could not note the server's shared-memory regions: {e}")

    def _remove_regions(self):
        """Remove the stopped server's shared-memory regions that are still there."""
        gone = leftovers.unlink_regions(sorted(self.regions))
        if gone:
            log(f"removed {len(gone)} shared-memory region(s) the server's model processes left in {leftovers.SHM_DIR}")
        self.regions = set()
        self._save_regions()

    def _end_requests_by(self, deadline: float):
        """The time from which the server's running requests end (voxcpm_triton.serving.runtime.stopping)."""
        if not self.run_dir:
            return
        tmp = os.path.join(self.run_dir, f".{runtime.STOPPING_FILE}")
        try:
            with open(tmp, "w", encoding="ascii") as f:
                f.write(repr(deadline))
            os.replace(tmp, os.path.join(self.run_dir, runtime.STOPPING_FILE))
        except OSError as e:
            log(f"could not tell the models the server is stopping: {e}")

    def ready(self) -> bool:
        return self._health("ready")

    def _health(self, which: str) -> bool:
        """Triton's /v2/health/<which> (ready, live) answered 200 within 2 s."""
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/{which}", timeout=2) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # (nohup: its terminal may close)
            signal.signal(signal.SIGHUP, self._on_signal)  # its terminal closed: stop as cleanly as on SIGTERM
        dirs, regions = leftovers.remove_abandoned_state_dirs()
        if dirs:
            log(f"removed what {len(dirs)} killed supervisor(s) left: {', '.join(dirs)}"
                + (f", and {len(regions)} shared-memory region(s) of their servers" if regions else ""))
        self.state_dir, self.held_fd = leftovers.make_state_dir()
        self.companions = [companion.Companion(argv, self.state_dir, self.held_fd, self.opts.companion_grace,
                                     self.opts.max_failed_starts)
                           for argv in self.companion_argvs]
        backoff = 1.0
        failed = 0  # starts in a row that never served
        held_since = held_logged = 0.0  # another process holds a port: since when, when last said
        held: list[str] = []
        claims: list[socket.socket] = []
        while not self.stopping:
            elsewhere = []
            if not claims:
                claims, elsewhere = ports.claim(self.ports)
            # the companions run on across the server's restarts: their ports are checked before the first start
            checked = [p for p in self.ports if p[0] != "companion" or not self.started_once]
            taken = elsewhere or ports.taken(checked)
            if taken:
                # A server that is still stopping (the one a killed supervisor left) holds them for up to
                # its exit timeout: wait for them as long as a start may take, without counting starts.
                now = time.monotonic()
                if not held:
                    held_since = now
                if taken != held or now - held_logged >= 30:
                    log(f"not starting: port in use by another process: {', '.join(taken)} (checking every 2-2.5 s)")
                    held, held_logged = taken, now
                if now - held_since > self.opts.start_timeout:
                    self.fatal = f"port in use by another process: {', '.join(taken)}, for {now - held_since:.0f} s"
                    break
                self._sleep(2.0 + random.random() / 2)  # two claiming at once, each backing off: not in step
                continue
            held = []
            self.start()
            reason = self.watch()
            if self.stopping:
                break
            up = time.monotonic() - self.started
            # A broken server's requests to its dead model never finish: don't wait out its exit timeout.
            self.stop(reason, grace=BROKEN_GRACE_S)
            if self.stopping:
                break
            # Served: passed a probe (became ready, without probes). A start that breaks before that
            # counts as failed: a model that loads but cannot synthesize would restart forever.
            served = self.was_healthy or (self.was_ready and self.opts.probe_interval <= 0)
            failed = 0 if served else failed + 1
            if self.opts.max_failed_starts and failed >= self.opts.max_failed_starts:
                self.fatal = (f"{failed} start(s) in a row did not serve (never ready, or never passed a probe); "
                              f"the last: {reason}")
                break
            backoff = 1.0 if served and up > 60 else min(backoff * 2, 30.0)  # a crash loop backs off
            log(f"restarting in {backoff:.0f} s: {reason}")
            self._sleep(backoff)
        self._shutdown()
        for c in claims:  # the server is gone: its ports are free for another supervisor
            c.close()
        if self.fatal:
            log(f"giving up: {self.fatal}")
            return 1
        return 0

    def _shutdown(self):
        """Stop the server and the companions, which drain their requests at the same time."""
        for c in self.companions:
            c.terminate()
        self.stop(f"giving up: {self.fatal}" if self.fatal else "asked to stop")
        for c in self.companions:
            c.stop()
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if self.held_fd is not None:
                os.close(self.held_fd)

    def watch(self) -> str:
        """Wait until the server must be restarted; -> why."""
        o = self.opts
        ready_since = None
        failures = 0
        next_probe = 0.0
        next_scan = 0.0
        while not self.stopping:
            if self.proc.poll() is not None:
                return f"tritonserver exited with code {self.proc.returncode}"
            now = time.monotonic()
            if ready_since is None:
                # noted while it loads too: a server that dies loading (its model processes with it)
                # leaves its regions, and nobody could find them after
                if now >= next_scan:
                    commands = groups.commands_of(self.proc.pid)
                    self._note_regions(commands)
                    if self.python_env is None:
                        self._note_python_env(commands)
                    next_scan = now + 1.0
                if self.ready():
                    ready_since, self.was_ready = now, True
                    if self.python_env is None:
                        self._note_python_env(groups.commands_of(self.proc.pid))
                    log(f"tritonserver ready after {now - self.started:.1f} s")
                elif now - self.started > o.start_timeout:
                    return f"not ready after {o.start_timeout:.0f} s"
                self._sleep(0.5)
                continue
            dead = self._dead_model()
            if dead:
                return dead
            if o.probe_interval <= 0 or now < next_probe:
                self._sleep(0.5)
                continue
            result = self._probe()
            if result is None:
                break
            status, what = result
            next_probe = time.monotonic() + o.probe_interval
            self._note_regions(groups.commands_of(self.proc.pid))  # a model loaded since
            if status == probe.HEALTHY:
                failures, self.was_healthy = 0, True
            elif status == DEAD_MODEL:
                return what
            elif status == probe.BROKEN:
                return f"probe: {what}"
            else:
                failures += 1
                log(f"probe failed ({failures}/{o.probe_failures}): {what}")
                if failures >= o.probe_failures:
                    return f"probe failed {failures} times: {what}"
        return "asked to stop"

    def _dead_model(self) -> str | None:
        """Why the server must be restarted now, from its model processes' beacons: one has died, stopped
        answering, or reports it cannot serve. Nothing inside Triton 2.51 can end the requests a dead
        orchestrator process held (their streams would wait for good), and nothing brings the process
        back; a restart does both, without waiting for a probe (or with probes off)."""
        if not self.run_dir:
            return None
        if not os.path.isdir(self.run_dir):  # (a /tmp cleaner?) its sockets, key and beacons are gone with it
            return f"model process: the server's runtime directory {self.run_dir} is gone"
        fault = liveness.beacon_fault(directory=self.run_dir)
        if fault is None or fault[0] == "unreadable":
            self.stale_since = None
            return None
        kind, why = fault
        if kind == "stale":  # beacons carry wall-clock times: a clock step makes them look stale once
            now = time.monotonic()
            self.stale_since = self.stale_since or now
            if now - self.stale_since < STALE_CONFIRM_S:
                return None
            if not self._health("live"):  # a process waiting on the server's IPC stops its beacon too
                return f"tritonserver is not answering, nor its model processes that wait on it: {why}"
        return f"model process: {why}"

    def _probe(self):
        """probe.probe in a daemon thread, so that a signal is not kept waiting for it; None if stopping.
        A model process found dead meanwhile ends the wait: (DEAD_MODEL, why); the probe's thread is
        then left to end with its server (stop() waits for it)."""
        out: list = []
        t = threading.Thread(target=lambda: out.append(probe.probe(self.url, self.opts.probe_timeout,
                                                                    metrics_url=self.metrics_url)), daemon=True)
        self.probe_thread = t
        t.start()
        next_check = time.monotonic() + 0.5
        while t.is_alive() and not self.stopping:
            t.join(0.1)
            self._tend()
            if time.monotonic() >= next_check:
                dead = self._dead_model()
                if dead:
                    return DEAD_MODEL, dead
                next_check = time.monotonic() + 0.5
        return out[0] if out else None

    def _sleep(self, seconds: float):
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(max(0.0, min(0.1, end - time.monotonic())))
            self._tend()

    def _tend(self):
        """Start or restart the companions, from the first server's start on: while another process
        holds the server's ports (a second copy of the service, say) nothing is started."""
        if self.stopping or not self.started_once:
            return
        for c in self.companions:
            c.tend()
            if self.opts.max_failed_starts and c.failures >= self.opts.max_failed_starts:
                self.fatal = (f"{c.name} exited {c.failures} times in a row within a minute of its start "
                              f"(last exit code {c.last_code})")
                self.stopping = True

    def _on_signal(self, signum, _frame):
        self.stopping = True
