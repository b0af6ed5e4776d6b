"""Minor page faults of a local server and of every process under it, summed by name (Linux /proc).

A page a process touches for the first time (of its heap, of a Python backend shared-memory region)
costs a minor fault; a server's first bursts touch pages its later ones reuse. Triton's Python stubs
are named by their model (`triton_python_backend_stub <repository>/<model>/<version>/model.py ...`), so
a model's instances sum together; other processes by their command name.
"""

from __future__ import annotations

import os

STUB = "triton_python_backend_stub"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(command name, parent pid, minor faults) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, _, rest = f.read().rpartition(")")
    except OSError:
        return None
    fields = rest.split()  # from field 3 (state) on: ppid is field 4, minflt field 10
    return head.partition("(")[2], int(fields[1]), int(fields[7])


def _name(pid: int, comm: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return comm
    if os.path.basename(argv[0]) == STUB and len(argv) > 1 and argv[1].count("/") >= 2:
        return argv[1].split("/")[-3]
    return comm


def _resident_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def minor_faults(root: int) -> dict[str, int]:
    """Minor faults so far of `root` and its descendants, summed by name ({} when root is gone)."""
    return {name: faults for name, (faults, _) in _tree(root).items()}


def resident_mib(root: int) -> dict[str, float]:
    """Resident memory now of `root` and its descendants, MiB, summed by name (shared pages counted in each)."""
    return {name: round(rss, 1) for name, (_, rss) in _tree(root).items()}


def _tree(root: int) -> dict[str, tuple[int, float]]:
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            procs[int(d)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, tuple[int, float]] = {}
    todo = [root] if root in procs else []
    while todo:
        pid = todo.pop()
        comm, _, faults = procs[pid]
        name = _name(pid, comm)
        f, rss = out.get(name, (0, 0.0))
        out[name] = (f + faults, rss + _resident_mib(pid))
        todo += children.get(pid, [])
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Faults between two `minor_faults` readings, by name, largest first."""
    d = {k: v - before.get(k, 0) for k, v in after.items()}
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))
