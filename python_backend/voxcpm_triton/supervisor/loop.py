"""The supervision loop, the policy over tritonserver.py's mechanism: when to start the server (its
ports free and claimed), when it is broken (its exit, a model process's beacon, probes), when to
restart it and when to give up; companions tended beside it."""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import socket
import threading
import time

from ..coordination import liveness
from . import companion, leftovers, ports, probe, server_args, tritonserver
from .log import log

STALE_CONFIRM_S = 3.0  # a beacon found stale must stay so this long (its process beats every second)
BROKEN_GRACE_S = 5.0  # what a server being restarted gets after SIGTERM before SIGKILL
PROBE_JOIN_S = 5.0  # what a probe cut short gets to end once its server is gone
DEAD_MODEL = "dead model"  # _probe's status when a model process was found dead while it ran


class Supervisor:
    def __init__(self, command: list[str], opts):
        self.opts = opts
        self.server = tritonserver.TritonServer(server_args.own_shm_prefix(server_args.restricted(command)))
        self.companion_argvs = [shlex.split(c) for c in getattr(opts, "companion", None) or []]
        self.companions: list[companion.Companion] = []  # made by run(), with the state directory
        # the companions' own ports: a start waits for them too (a gateway that cannot listen would
        # fail its starts beside a server that had loaded for nothing)
        self.ports = server_args.endpoints(self.server.args)
        self.ports += [("companion", *ports.host_port(a)) for a in getattr(opts, "companion_port", None) or []]
        self.stale_since: float | None = None  # when a stale beacon was first seen (_dead_model)
        self.probe_thread: threading.Thread | None = None  # the last probe's (_probe)
        self.state_dir: str | None = None  # the runs' parent, kept across restarts
        self.held_fd: int | None = None  # its `held` file, locked (leftovers.make_state_dir)
        self.was_healthy = False  # the current server passed a probe
        self.stopping = False
        self.started_once = False  # companions start with the first server
        self.fatal: str | None = None  # why the supervisor gives up (exit 1)

    def start(self):
        if self.state_dir is None:
            self.state_dir, self.held_fd = leftovers.make_state_dir()
        self.server.start(self.state_dir, self.held_fd)
        self.started_once, self.was_healthy, self.stale_since = True, False, None

    def stop(self, why: str, grace: float | None = None):
        """The server's stop; a probe of it still running is waited for once it is gone."""
        self.server.stop(why, grace, when_gone=self._end_probe)

    def _end_probe(self):
        """A probe cut short (a model process died meanwhile) fails once its server is gone; wait for it,
        so that it cannot reach the next server on the same port."""
        t, self.probe_thread = self.probe_thread, None
        if t is not None and t.is_alive():
            t.join(PROBE_JOIN_S)
            if t.is_alive():
                log(f"a probe of the stopped server is still running after {PROBE_JOIN_S:g} s")

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
                hint = f"; {self.opts.port_hint}" if getattr(self.opts, "port_hint", "") else ""
                if taken != held or now - held_logged >= 30:
                    log(f"not starting: port in use by another process: {', '.join(taken)} (checking every 2-2.5 s"
                        f"{hint})")
                    held, held_logged = taken, now
                if now - held_since > self.opts.start_timeout:
                    self.fatal = (f"port in use by another process: {', '.join(taken)}, for {now - held_since:.0f} s"
                                  f"{hint}")
                    break
                self._sleep(2.0 + random.random() / 2)  # two claiming at once, each backing off: not in step
                continue
            held = []
            self.start()
            reason = self.watch()
            if self.stopping:
                break
            up = time.monotonic() - self.server.started
            # A broken server's requests to its dead model never finish: don't wait out its exit timeout.
            self.stop(reason, grace=BROKEN_GRACE_S)
            if self.stopping:
                break
            # Served: passed a probe (became ready, without probes). A start that breaks before that
            # counts as failed: a model that loads but cannot synthesize would restart forever.
            served = self.was_healthy or (self.server.was_ready and self.opts.probe_interval <= 0)
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
            if self.server.proc.poll() is not None:
                return f"tritonserver exited with code {self.server.proc.returncode}"
            now = time.monotonic()
            if ready_since is None:
                if now >= next_scan:  # while it loads too: a server that dies loading leaves its regions
                    self.server.scan()
                    next_scan = now + 1.0
                if self.server.ready():
                    ready_since = now
                    self.server.scan()
                    log(f"tritonserver ready after {now - self.server.started:.1f} s")
                elif now - self.server.started > o.start_timeout:
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
            self.server.scan(python_env=False)  # a model loaded since
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
        if not self.server.run_dir:
            return None
        if not os.path.isdir(self.server.run_dir):  # (a /tmp cleaner?) its sockets, key and beacons are gone with it
            return f"model process: the server's runtime directory {self.server.run_dir} is gone"
        fault = liveness.beacon_fault(directory=self.server.run_dir)
        if fault is None or fault[0] == "unreadable":
            self.stale_since = None
            return None
        kind, why = fault
        if kind == "stale":  # beacons carry wall-clock times: a clock step makes them look stale once
            now = time.monotonic()
            self.stale_since = self.stale_since or now
            if now - self.stale_since < STALE_CONFIRM_S:
                return None
            if not self.server.health("live"):  # a process waiting on the server's IPC stops its beacon too
                return f"tritonserver is not answering, nor its model processes that wait on it: {why}"
        return f"model process: {why}"

    def _probe(self):
        """probe.probe in a daemon thread, so that a signal is not kept waiting for it; None if stopping.
        A model process found dead meanwhile ends the wait: (DEAD_MODEL, why); the probe's thread is
        then left to end with its server (stop() waits for it)."""
        out: list = []
        t = threading.Thread(target=lambda: out.append(probe.probe(self.server.url, self.opts.probe_timeout,
                                                                   metrics_url=self.server.metrics_url)), daemon=True)
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
