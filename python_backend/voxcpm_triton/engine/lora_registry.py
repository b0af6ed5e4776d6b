"""Which LoRA adapter is in which slot of the GPU tables, and who uses it: the engine's policy for
adding, replacing and removing adapters while requests run.

Plain Python (no torch, no thread): the engine calls it under its lock. Slot 0 is the base model
and never handed out. A request holds its adapter's slot from submission to its end (`acquire`,
`release`). Removing or replacing a name takes it away from new requests at once; its slot goes
back to the free list only when the last request holding it has ended, so running requests finish
with the weights they started with. Each publication gets a new generation number, so a name that
is replaced is never mistaken for its old weights (the prefix cache's salt uses it).
"""

from __future__ import annotations

from collections import Counter


class LoraFull(RuntimeError):
    """Every slot holds an adapter (or one still in use by requests)."""


class LoraRegistry:
    def __init__(self, max_loras: int, loaded: dict | None = None):
        """loaded: name -> slot of the adapters already written into the tables."""
        self.max_loras = max_loras
        self.published: dict = {}  # name -> (slot, generation)
        self.refs: Counter = Counter()  # slot -> requests holding it
        self.retired: set = set()  # slots taken from their name, waiting for their requests to end
        self._generation = 0
        for name, slot in (loaded or {}).items():
            if not 1 <= slot <= max_loras or slot in {s for s, _ in self.published.values()}:
                raise ValueError(f"adapter {name!r}: slot {slot} is not a free slot of 1..{max_loras}")
            self.published[name] = (slot, self._next())
        used = {s for s, _ in self.published.values()}
        self.free = [s for s in range(max_loras, 0, -1) if s not in used]  # pop() gives the lowest

    def _next(self) -> int:
        self._generation += 1
        return self._generation

    def names(self) -> list:
        return sorted(self.published)

    def unknown(self, name: str) -> KeyError:
        loaded = ", ".join(self.names()) or "none"
        return KeyError(f"unknown LoRA adapter {name!r} (loaded: {loaded})")

    def acquire(self, name: str) -> tuple[int, int]:
        """A new request on adapter `name` -> (slot, generation); KeyError if it is not loaded."""
        if name not in self.published:
            raise self.unknown(name)
        slot, gen = self.published[name]
        self.refs[slot] += 1
        return slot, gen

    def release(self, slot: int):
        """A request holding `slot` has ended."""
        if slot == 0:
            return
        self.refs[slot] -= 1
        if self.refs[slot] <= 0:
            del self.refs[slot]
            if slot in self.retired:
                self.retired.discard(slot)
                self.free.append(slot)

    def check_free(self, name: str | None = None):
        """LoraFull when no slot is free (for adding adapter `name`, which may replace a loaded one)."""
        if not self.free:
            busy = f"; {len(self.retired)} wait for their requests to end" if self.retired else ""
            # A replacement is written beside the old weights, which serve its running requests.
            replacing = (f"; replacing {name!r} needs a free slot too: remove an adapter first"
                         if name in self.published and not self.retired else "")
            raise LoraFull(f"all {self.max_loras} LoRA slots are in use (parameter max_loras){busy}{replacing}")

    def take_free(self, name: str | None = None) -> int:
        """A slot to write adapter `name` into (not visible until `publish`)."""
        self.check_free(name)
        self.free.sort(reverse=True)
        return self.free.pop()

    def give_back(self, slot: int):
        """A slot from `take_free` that was not published (its write failed)."""
        self.free.append(slot)

    def publish(self, name: str, slot: int) -> int:
        """`name` now means the adapter written into `slot` -> its generation. A previous adapter of
        that name is retired."""
        old = self.published.get(name)
        self.published[name] = (slot, self._next())
        if old is not None:
            self._retire(old[0])
        return self.published[name][1]

    def unpublish(self, name: str):
        """Remove `name`: no new request may use it; its slot is freed once its requests have ended."""
        if name not in self.published:
            raise self.unknown(name)
        slot, _ = self.published.pop(name)
        self._retire(slot)

    def _retire(self, slot: int):
        if self.refs.get(slot, 0) > 0:
            self.retired.add(slot)
        else:
            self.free.append(slot)
