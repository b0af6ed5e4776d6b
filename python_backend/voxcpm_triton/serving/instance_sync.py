"""What the instances of one model tell each other, through the server's runtime directory
(`run_state.run_dir()`: every model process of a server finds the same one).

Triton hands each request to one instance. Two of the decoder's control requests concern every
instance: a cancel (the request may be on another one) and a LoRA change (every engine holds its
own adapters). The instance that gets one writes it here; every instance polls a few times a second.

- Cancels: `cancels/<sha256 of the request id>` holds the id. The instance holding the request
  cancels it and removes the marker. A marker no instance takes (its request has ended) is removed
  after CANCEL_TTL_S; until then a cancel that overtook its request still applies once it is submitted.
- Shared slots (`SharedSlots`): at most n holders among the instances, one file lock each in
  `<name>/<k>.lock`, released with its process however it ends (`tts`'s waits for text_normalizer).
- LoRA adapters: `instance_loras.json` is the set every instance converges to, {generation, adapters:
  {name: generation of its last add}} (an adapter added again is loaded again everywhere); changed
  under the `instance_loras.lock` file lock, replaced atomically, so a reader sees one whole record.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from typing import Callable

from ..coordination import run_state

log = logging.getLogger("voxcpm_triton.instance_sync")

POLL_PERIOD_S = 0.2
# Longer than any wait between a request's dispatch and its submission to an engine.
CANCEL_TTL_S = 60.0
# In the run directory; not run_state.LORAS_FILE, the adapters a restart loads again.
RECORD_FILE, RECORD_LOCK = "instance_loras.json", "instance_loras.lock"


class CancelBoard:
    def __init__(self, root: str | None = None, ttl_s: float = CANCEL_TTL_S):
        self.dir, self.ttl = os.path.join(root or run_state.run_dir(), "cancels"), ttl_s
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def post(self, request_id: str):
        name = hashlib.sha256(request_id.encode()).hexdigest()
        run_state.write_atomic(os.path.join(self.dir, name), request_id)

    def sweep(self, cancel: Callable[[str], bool], now: float | None = None):
        """`cancel(request_id)` -> True if this instance held the request (its marker is then removed)."""
        now = time.time() if now is None else now
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.dir, name)
            try:
                if now - os.stat(path).st_mtime > self.ttl:
                    os.unlink(path)
                    continue
                if name.startswith("."):  # being written
                    continue
                with open(path, encoding="utf-8") as f:
                    request_id = f.read()
                if cancel(request_id):
                    os.unlink(path)
            except FileNotFoundError:
                continue  # taken by another instance meanwhile


class SharedSlots:
    """At most `n` holders at once among a model's instances (each a process of its own)."""

    def __init__(self, name: str, n: int, root: str | None = None):
        folder = os.path.join(root or run_state.run_dir(), name)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.paths = [os.path.join(folder, f"{k}.lock") for k in range(n)]

    @contextlib.contextmanager
    def hold(self):
        """A free slot held for the block -> True; False (nothing held) when all n are taken."""
        for path in self.paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield True
            finally:
                os.close(fd)  # and its lock
            return
        yield False


class LoraRecord:
    """`instance_loras.json`: the adapters every instance should hold."""

    def __init__(self, root: str | None = None):
        root = root or run_state.run_dir()
        self.path, self.lock_path = os.path.join(root, RECORD_FILE), os.path.join(root, RECORD_LOCK)

    def stamp(self):
        """Changes whenever the record is replaced (a new file each time); None while there is none."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def read(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def locked(self):
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def write(self, record: dict):
        run_state.write_atomic(self.path, json.dumps(record, sort_keys=True))


class Peers:
    """A decoder instance's side of the exchange: `engine` has cancel(id) -> bool, lora_names(),
    add_lora(name) and remove_lora(name). `loras`: the engine serves adapters at all. `cancel`
    (default: the engine's) -> whether this instance held the request."""

    def __init__(self, engine, loras: bool, root: str | None = None, period_s: float = POLL_PERIOD_S,
                 cancel: Callable[[str], bool] | None = None):
        self.engine, self.period = engine, period_s
        self._cancel = cancel or engine.cancel
        self.cancels = CancelBoard(root)
        self.record = LoraRecord(root) if loras else None
        self._mutex = threading.Lock()  # one convergence or change at a time in this process
        self._applied = {n: 0 for n in engine.lora_names()} if loras else {}  # lora_dir's, at start
        self._seen = None  # the record's stamp last converged to
        self._warned: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="instance-sync", daemon=True)
        self._thread.start()

    # -- cancels
    def cancel(self, request_id: str):
        """A cancel this instance received: here, or for whichever instance holds the request."""
        if not self._cancel(request_id):
            self.cancels.post(request_id)

    # -- LoRA adapters
    def sync_loras(self):
        """Converge to the record if it changed (a stat when it did not)."""
        if self.record is None or self.record.stamp() == self._seen:
            return
        with self._mutex:
            stamp = self.record.stamp()
            if stamp != self._seen and self._converge(self.record.read()):
                self._seen = stamp

    def change_lora(self, action: str, name: str) -> list:
        """add / remove here, then publish it for the other instances -> the names loaded after.
        A change that fails here (a bad adapter, no free slot) is not published."""
        assert self.record is not None and action in ("add", "remove")
        with self._mutex, self.record.locked():
            current = self.record.read()
            converged = self._converge(current)
            names = self.engine.add_lora(name) if action == "add" else self.engine.remove_lora(name)
            generation = (current or {}).get("generation", 0) + 1
            adapters = dict(current["adapters"]) if current else dict(self._applied)
            if action == "add":
                adapters[name] = generation
            else:
                adapters.pop(name, None)
            self.record.write({"generation": generation, "adapters": adapters})
            if action == "add":
                self._applied[name] = generation
            else:
                self._applied.pop(name, None)
            if converged:  # else the next poll tries the rest again
                self._seen = self.record.stamp()
        return names

    def _converge(self, record: dict | None) -> bool:
        """Remove what the record lacks, (re)load what is new to it -> False if something failed
        (tried again at the next poll)."""
        if record is None:
            return True
        want, ok = record["adapters"], True
        for name in [n for n in self._applied if n not in want]:
            with contextlib.suppress(ValueError):  # not loaded here
                self.engine.remove_lora(name)
            del self._applied[name]
        for name, generation in want.items():
            if self._applied.get(name) == generation:
                continue
            try:
                self.engine.add_lora(name)
                self._applied[name] = generation
            except Exception as e:  # noqa: BLE001 - a full table frees up as requests end: retried
                ok = False
                if (name, generation) not in self._warned:
                    self._warned.add((name, generation))
                    log.warning("LoRA adapter %r added on another instance could not be loaded here "
                                "(trying again): %s", name, e)
        return ok

    # -- the poll
    def _run(self):
        while not self._stop.wait(self.period):
            try:
                self.cancels.sweep(self._cancel)
                self.sync_loras()
            except Exception:  # noqa: BLE001 - keep polling: the next round may succeed
                log.exception("polling the other instances' cancels and LoRA changes failed")

    def stop(self):
        self._stop.set()
        self._thread.join(2 * self.period + 1.0)
