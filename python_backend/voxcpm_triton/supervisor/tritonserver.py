"""One tritonserver at a time and what it leaves: the mechanism under the supervisor's policy. Its
start (run directory, internal key, guard), its stop (the running requests' deadline, SIGTERM,
a held stop ended, SIGKILL to what is left), its health endpoints, and the shared-memory regions,
run directory and python backend directory it leaves when killed."""

from __future__ import annotations

import glob
import http.client
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Callable

from ..coordination import liveness, run_state, runtime
from . import groups, guard, leftovers, ports, server_args
from .log import log

HELD_IDLE_S = 5.0  # a stopping server whose model processes all stay idle and loaded this long is held


class TritonServer:
    def __init__(self, args: list[str]):
        self.args = args  # its whole command line
        endpoints = server_args.endpoints(args)
        _, host, port = next((p for p in endpoints if p[0] == "http"), ("http", "127.0.0.1", 8000))
        self.url = ports.url(host, port)
        metrics = next((p for p in endpoints if p[0] == "metrics"), None)
        self.metrics_url = ports.url(*metrics[1:]) if metrics else None  # a probe queued behind work counts as alive
        self.exit_timeout = float(server_args.option(args, "exit-timeout-secs", "30"))
        self.beacons_tell_all = server_args.only_beacon_models(args)  # see wait_exit
        if not self.beacons_tell_all:
            log("the model repository has models of its own (or cannot be read): a stopping server is left "
                "its whole exit timeout, never judged held")
        self.shm_prefix = server_args.shm_prefix(args)
        self.proc: subprocess.Popen | None = None
        self.guard: subprocess.Popen | None = None  # guard.py, beside the server
        self.started = 0.0
        self.was_ready = False  # the running server became ready
        self.state_dir: str | None = None  # the supervisor's, where its run directory is made
        self.run_dir: str | None = None
        self.envs_before: set[str] = set()  # the python backend's directories before this server started
        self.python_env: str | None = None  # and the one it made, if known
        self.regions: set[str] = set()  # its model processes' shared-memory regions

    def scan(self, python_env: bool = True):
        """Note what the running server's processes show now: their shared-memory regions (a server that
        dies loading leaves them, and nobody could find them after) and, until it is ready, its python
        backend directory (later, another server's could be the only new one)."""
        commands = groups.commands_of(self.proc.pid)
        self.note_regions(commands)
        if python_env and self.python_env is None:
            self.note_python_env(commands)

    def start(self, state_dir: str, held_fd: int | None):
        """Start tritonserver in a process group of its own, with a fresh run directory in `state_dir`
        (whose `held` file's descriptor it keeps open) and its guard beside it."""
        self.state_dir = state_dir
        self.run_dir = tempfile.mkdtemp(prefix="run-", dir=self.state_dir)
        # VOXCPM_SUPERVISOR_PID: killed (SIGKILL), it cannot write `stopping`; the models then end their
        # requests themselves before tritonserver's forced exit (voxcpm_triton.coordination.runtime.stop_deadline)
        env = dict(os.environ, VOXCPM_RUN_DIR=self.run_dir, VOXCPM_STATE_DIR=self.state_dir,
                   VOXCPM_SUPERVISOR_PID=str(os.getpid()))
        if not env.get("VOXCPM_INTERNAL_KEY"):
            env["VOXCPM_INTERNAL_KEY"] = secrets.token_hex(32)
        self.envs_before, self.python_env = set(glob.glob(leftovers.PYTHON_ENV_GLOB)), None
        self.proc = groups.spawn(self.args, env, held_fd)
        # what is left of the server if this process is killed (guard.py)
        self.guard = subprocess.Popen([sys.executable, "-m", guard.__name__, str(self.proc.pid), str(os.getpid()),
                                       str(self.exit_timeout), self.shm_prefix], cwd=guard.IMPORT_ROOT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.started, self.was_ready = time.monotonic(), False
        log(f"tritonserver started (pid {self.proc.pid})")

    def stop(self, why: str, grace: float | None = None, when_gone: Callable[[], None] = lambda: None):
        """SIGTERM, wait `grace` (default: the server's exit timeout plus slack), then SIGKILL what is
        left of its group; `when_gone` runs once the group is gone, before its leftovers are removed."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.monotonic()
        self.note_regions(groups.commands_of(proc.pid))
        if proc.poll() is None:
            log(f"stopping tritonserver ({why})")
            drain = self.exit_timeout / 2 if grace is None else 0.0
            self._end_requests_by(time.time() + drain)
            proc.send_signal(signal.SIGTERM)
            late = self.wait_exit(proc, self.exit_timeout + 10 if grace is None else grace, drain)
            if late:
                log(f"{late}: SIGKILL")
                groups.kill(proc.pid)
        left = groups.wait(proc.pid, 5)  # model processes end on their own once the server is gone
        if left:
            log(f"killing {len(left)} leftover process(es) of the server: {left}")
            groups.kill(proc.pid)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        left = groups.wait(proc.pid, 5)  # killed processes take a moment to go
        when_gone()
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

    def wait_exit(self, proc: subprocess.Popen, seconds: float, drain: float = 0.0) -> str | None:
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

    def note_python_env(self, commands: dict[int, list[str]]):
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

    def note_regions(self, commands: dict[int, list[str]]):
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
        """Remove the stopped server's shared-memory regions that are still there: those its processes
        named, and with a prefix of the supervisor's own every region of it (leftovers.own_regions)."""
        gone = leftovers.unlink_regions(sorted(self.regions | set(leftovers.own_regions(self.shm_prefix))))
        if gone:
            log(f"removed {len(gone)} shared-memory region(s) the server's model processes left in {leftovers.SHM_DIR}")
        self.regions = set()
        self._save_regions()

    def _end_requests_by(self, deadline: float):
        """The time from which the server's running requests end (voxcpm_triton.coordination.runtime.stopping)."""
        if not self.run_dir:
            return
        try:
            run_state.write_atomic(os.path.join(self.run_dir, runtime.STOPPING_FILE), repr(deadline))
        except OSError as e:
            log(f"could not tell the models the server is stopping: {e}")

    def ready(self) -> bool:
        """Triton's ready endpoint answers 200; from then on the server counts as having been ready."""
        if self.health("ready"):
            self.was_ready = True
            return True
        return False

    def health(self, which: str) -> bool:
        """Triton's /v2/health/<which> (ready, live) answered 200 within 2 s."""
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/{which}", timeout=2) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False
