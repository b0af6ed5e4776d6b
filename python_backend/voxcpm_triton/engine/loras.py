"""The engine's LoRA adapters while it runs: which name is in which slot (`LoraRegistry`, under the
engine's lock), adapters added and removed without a restart, and the writes into the GPU slot
tables, which only the engine thread makes, between steps, on the stream the steps run on: a slot
is written only while no request holds it, and stream order puts the write after any step still
in flight that read it.
"""

from __future__ import annotations

import threading
from collections import deque

from .lora_registry import LoraRegistry

ADD_TIMEOUT_S = 120.0


class EngineLoras:
    def __init__(self, adapters, lock: threading.Condition):
        """adapters: the model's `lora_adapters.AdapterSet` (tables written at load); lock: the engine's."""
        self.adapters, self.tables, self.lock = adapters, adapters.tables, lock
        self.registry = LoraRegistry(self.tables.max_loras, adapters.slots)
        self._writes: deque = deque()  # (name, slot, adapter, done event, outcome) for the engine thread
        self._closed: str | None = None

    # -- callers (any thread)
    def acquire(self, name: str) -> tuple[int, bytes]:
        """A request on adapter `name` -> (slot, prefix-cache salt); ValueError if it is not loaded."""
        with self.lock:
            try:
                slot, gen = self.registry.acquire(name)
            except KeyError as e:
                raise ValueError(e.args[0]) from None
        return slot, f"lora:{name}:{gen}".encode()

    def names(self) -> list:
        with self.lock:
            return self.registry.names()

    def add(self, name: str, timeout: float = ADD_TIMEOUT_S) -> list:
        """Load adapter `name` from the LoRA directory into a free slot (replacing a loaded one of
        that name: requests running on it finish with its old weights) -> the names loaded after.
        LoraError (formats.lora) for a bad adapter, LoraFull when no slot is free."""
        with self.lock:  # a full table refuses before the files are read (instances retry it often)
            self.registry.check_free(name)
        adapter = self.adapters.read(name)  # file reading and checks, here in the caller's thread
        done, outcome = threading.Event(), {}
        with self.lock:
            if self._closed:
                raise RuntimeError(self._closed)
            write = (name, self.registry.take_free(name), adapter, done, outcome)
            self._writes.append(write)
            self.lock.notify()
        if not done.wait(timeout) and self._withdraw(write):
            raise TimeoutError(f"adding LoRA adapter {name!r}: the engine did not write it within {timeout:.0f} s")
        if not done.wait(timeout):  # the engine thread took it and is writing it
            raise TimeoutError(f"adding LoRA adapter {name!r}: its write did not finish within {timeout:.0f} s "
                               "(it is still published when it does)")
        if "error" in outcome:
            raise RuntimeError(f"adding LoRA adapter {name!r} failed: {outcome['error']}")
        return self.names()

    def _withdraw(self, write) -> bool:
        """A queued write the engine thread has not taken yet leaves the queue and gives its slot
        back, so that an add that timed out does not happen later -> whether it was still queued."""
        with self.lock:
            queued = [w for w in self._writes if w is not write]
            if len(queued) == len(self._writes):
                return False
            self._writes = deque(queued)
            self.registry.give_back(write[1])
            return True

    def remove(self, name: str) -> list:
        """Take `name` away from new requests -> the names loaded after. Its slot is freed once the
        requests holding it have ended. ValueError for an unknown name."""
        with self.lock:
            try:
                self.registry.unpublish(name)
            except KeyError as e:
                raise ValueError(e.args[0]) from None
            return self.registry.names()

    # -- the engine (with its lock held where it says so)
    def release(self, slot: int):
        """A request holding `slot` has ended (lock held)."""
        self.registry.release(slot)

    def pending(self) -> bool:
        """Writes waiting for the engine thread (lock held)."""
        return bool(self._writes)

    def apply(self, before_write=None):
        """The engine thread, between steps: write the queued adapters and publish their names.
        before_write(slot) is called before a slot's tables are written."""
        while True:
            with self.lock:
                if not self._writes:
                    return
                name, slot, adapter, done, outcome = self._writes.popleft()
            try:
                if before_write is not None:
                    before_write(slot)
                self.tables.write(slot, adapter.weights, adapter.scale)
            except Exception as e:  # noqa: BLE001 - reported to the caller; the slot goes back
                with self.lock:
                    self.registry.give_back(slot)
                outcome["error"] = f"{type(e).__name__}: {e}"
            else:
                with self.lock:
                    self.registry.publish(name, slot)
            done.set()

    def close(self, message: str):
        """The engine has stopped: queued adds fail with `message`."""
        with self.lock:
            self._closed = message
            writes, self._writes = list(self._writes), deque()
        for _, _, _, done, outcome in writes:
            outcome["error"] = message
            done.set()
