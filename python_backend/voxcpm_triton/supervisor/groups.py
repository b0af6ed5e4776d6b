"""Process groups read from /proc, and the children the supervisor starts in groups of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from ..coordination import processes


def alive(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append(int(d))
    return out


def wait(pgid: int, seconds: float) -> list[int]:
    """Wait up to `seconds` for the group's processes to end; -> those still alive."""
    deadline = time.monotonic() + seconds
    while (left := alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def command_line(pid: int) -> list[str]:
    """Process `pid`'s command line; [] if it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def commands_of(pgid: int) -> dict[int, list[str]]:
    """The group's live processes and their command lines: one /proc scan serves all that is read from them."""
    return {pid: command_line(pid) for pid in alive(pgid)}


def stub_pids(commands: dict[int, list[str]]) -> list[int]:
    """The python backend model processes among `commands` (commands_of)."""
    return [pid for pid, args in commands.items() if os.path.basename((args or [""])[0]) == processes.STUB_EXECUTABLE]


def kill(pgid: int) -> bool:
    """SIGKILL to every process of the group -> False if it had none left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def spawn(argv: list[str], env: dict[str, str] | None, held_fd: int | None) -> subprocess.Popen:
    """Start a child of the supervisor (the server, a companion) in a process group of its own, which
    gets SIGTERM if the supervisor dies first (even by SIGKILL) and holds the state directory's lock
    (`held_fd`, leftovers.make_state_dir) while it runs."""
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent, pass_fds=() if held_fd is None else (held_fd,))


def _die_with_parent():
    """preexec_fn: no child outlives the process that was supposed to stop it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the supervisor's SIGTERM handler still stops it
        pass
