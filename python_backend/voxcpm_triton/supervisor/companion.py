"""A process run beside the server (the OpenAI gateway), restarted on its own."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import time

from . import groups
from .log import log

UNIX_PATH_MAX = 107  # an AF_UNIX socket path's bytes


class Companion:
    """A process run beside the server: restarted whenever it exits, on its own (the server is
    not restarted for it, nor it for the server). Each start gets a TMPDIR of its own in the state
    directory, removed once that start's process group is gone: what a companion killed by SIGKILL
    leaves there (the gateway's forkserver socket directory) goes then, not never."""

    def __init__(self, argv: list[str], state_dir: str | None = None, held_fd: int | None = None,
                 grace: float = 25.0, max_failures: int = 0):
        self.argv = argv
        self.max_failures = max_failures  # quick exits in a row after which it is not restarted (0: none)
        self.grace = grace  # SIGTERM to SIGKILL: its in-flight requests' time (--companion-grace)
        self.state_dir, self.held_fd = state_dir, held_fd
        self.tmp: str | None = None  # the running start's TMPDIR
        self.left: list[tuple[int, str | None]] = []  # ended starts' (process group, TMPDIR): removed once it is gone
        self.warned = False
        self.name = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else os.path.basename(argv[0])
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.due = 0.0  # when to start it next
        self.failures = 0  # exits in a row within a minute of the start (a setting it refuses, a held port)
        self.last_code: int | None = None

    def tend(self):
        """Start it when it is due; notice when it has exited."""
        now = time.monotonic()
        self._remove_left()
        if self.proc is not None:
            if self.proc.poll() is None:
                return
            self.left.append((self.proc.pid, self.tmp))
            up = now - self.started
            self.failures = 0 if up > 60 else self.failures + 1
            self.last_code = self.proc.returncode
            backoff = min(2.0 ** self.failures, 30.0)  # 1 s after a long run, doubling while it keeps failing
            if self.max_failures and self.failures >= self.max_failures:  # the supervisor gives up on it
                log(f"{self.name} exited with code {self.proc.returncode}")
                self.proc, self.due = None, math.inf
                return
            log(f"{self.name} exited with code {self.proc.returncode}; restarting in {backoff:.0f} s")
            self.proc, self.due = None, now + backoff
        if now >= self.due:
            self.tmp = self._make_tmp()
            env = None if self.tmp is None else dict(os.environ, TMPDIR=self.tmp)
            # it holds the state directory too: no sweep takes its TMPDIR while it runs
            self.proc = groups.spawn(self.argv, env, self.held_fd)
            self.started = now
            log(f"{self.name} started (pid {self.proc.pid})")

    def terminate(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self):
        """SIGTERM, a grace period, then SIGKILL to what is left of its process group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not exit in time: SIGKILL")
        groups.kill(proc.pid)
        proc.wait()
        self.left.append((proc.pid, self.tmp))
        groups.wait(proc.pid, 5)
        self._remove_left()
        code = proc.returncode  # uvicorn ends on the SIGTERM it drained for, raised again: -15
        log(f"{self.name} stopped ({f'by {signal.strsignal(-code)}' if code < 0 else f'exit code {code}'})")

    def _make_tmp(self) -> str | None:
        """A TMPDIR for the next start in the state directory; None (the supervisor's own TMPDIR) where
        one there would make Python's multiprocessing socket paths (`<TMPDIR>/pymp-*/listener-*`, the
        gateway's upload decoders) longer than AF_UNIX allows."""
        if self.state_dir is None:
            return None
        longest = os.path.join(self.state_dir, "t" + "x" * 8, "pymp-" + "x" * 8, "listener-" + "x" * 8)
        if len(longest.encode()) > UNIX_PATH_MAX:
            if not self.warned:
                log(f"{self.name}: its TMPDIR stays {tempfile.gettempdir()}: one in {self.state_dir} would make its "
                    "socket paths too long, so what a SIGKILL leaves of it there stays")
                self.warned = True
            return None
        return tempfile.mkdtemp(prefix="t", dir=self.state_dir)

    def _remove_left(self):
        for pgid, tmp in list(self.left):
            if not groups.alive(pgid):
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                self.left.remove((pgid, tmp))
