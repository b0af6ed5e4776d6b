"""Minor page faults and memory of a local server and of every process under it, summed by name (Linux /proc).

A page a process touches for the first time (of its heap, of a Python backend shared-memory region)
costs a minor fault; a server's first bursts touch pages its later ones reuse. Triton's Python stubs
are named by their model (`triton_python_backend_stub <repository>/<model>/<version>/model.py ...`), so
a model's instances sum together; other processes by their command name.
"""

from __future__ import annotations

import os

STUB = "triton_python_backend_stub"


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(command name, parent pid, minor faults, start time in clock ticks) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, _, rest = f.read().rpartition(")")
    except OSError:
        return None
    fields = rest.split()  # from field 3 (state) on: ppid is field 4, minflt field 10, starttime field 22
    return head.partition("(")[2], int(fields[1]), int(fields[7]), int(fields[19])


def _name(pid: int, comm: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return comm
    if os.path.basename(argv[0]) == STUB and len(argv) > 1 and argv[1].count("/") >= 2:
        return argv[1].split("/")[-3]
    return comm


def _memory_mib(pid: int) -> tuple[float, float]:
    """(resident, of it shared memory such as a Python backend region) MiB, from /proc/<pid>/status."""
    got = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssShmem"):
                    got[key] = int(value.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return got.get("VmRSS", 0.0), got.get("RssShmem", 0.0)


def usage(root: int) -> dict[str, dict]:
    """Of `root` and its descendants now, summed by name ({} when root is gone): minor faults so far,
    resident MiB and, of that, MiB of shared memory mapped (shared pages counted in each process);
    "processes": each process's faults, by pid and start time, for `delta`."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            procs[int(d)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, dict] = {}
    todo = [root] if root in procs else []
    while todo:
        pid = todo.pop()
        comm, _, faults, start = procs[pid]
        rss, shmem = _memory_mib(pid)
        u = out.setdefault(_name(pid, comm), {"minor_faults": 0, "resident_mib": 0.0, "shared_mib": 0.0,
                                              "processes": {}})
        u["minor_faults"] += faults
        u["resident_mib"] = round(u["resident_mib"] + rss, 1)
        u["shared_mib"] = round(u["shared_mib"] + shmem, 1)
        u["processes"][(pid, start)] = faults
        todo += children.get(pid, [])
    return out


def by(key: str, now: dict[str, dict]) -> dict[str, float]:
    """One measure of a `usage` reading, by name."""
    return {name: u[key] for name, u in now.items()}


def delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, int]:
    """Minor faults between two `usage` readings, by name, largest first. A process started between them
    counts from its start (a stub Triton restarted, say); one that ended takes its faults since `before`
    with it."""
    # by process, whatever its name was: a stub forked but not yet exec'd is still named tritonserver
    was = {key: f for u in before.values() for key, f in u["processes"].items()}
    d = {name: sum(f - was.get(key, 0) for key, f in u["processes"].items()) for name, u in after.items()}
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))
