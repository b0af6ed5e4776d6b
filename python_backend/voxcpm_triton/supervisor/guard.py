"""Ends what a supervised tritonserver leaves behind when its supervisor is killed (SIGKILL: it
cannot stop the server itself). The supervisor starts one guard beside each server, in a session of
its own (a terminal's Ctrl-C or a signal to the supervisor's group does not reach it).

With the supervisor gone, tritonserver gets SIGTERM (PR_SET_PDEATHSIG) and stops. Model processes
caught between two commands while their models load can then hang in Triton's stub for good: its
exit waits for the interpreter lock, which the thread waiting for the dead server's next command
holds. The guard waits as the supervisor's own stop does (the server's exit timeout and 10 s, then 5 s
for its model processes to follow), then kills the server's process group and removes the
shared-memory regions its model processes' command lines named, and with the supervisor's own region
prefix every region of it. Then it removes what the next
supervisor would: the killed supervisor's state directory and the regions recorded there (a server
stopped by its death signal leaves its regions in /dev/shm). While the supervisor lives, the guard
only exits once the server's group is empty.

    python -m voxcpm_triton.supervisor.guard PGID SUPERVISOR_PID EXIT_TIMEOUT_S SHM_PREFIX
"""

from __future__ import annotations

import os
import sys
import time

from . import groups, leftovers
from .log import log

POLL_S = 0.5
# where `python -m` finds this package: the guard runs there, so that nothing in the supervisor's
# working directory can stand in for it
IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def guard(pgid: int, supervisor: int, exit_timeout: float, prefix: str) -> list[int]:
    """Watch until the group is empty, or clear it once the supervisor is gone -> the pids killed."""
    while os.getppid() == supervisor:
        if not groups.alive(pgid):
            return []
        time.sleep(POLL_S)
    killed = _clear(pgid, exit_timeout, prefix)
    # What the next supervisor would remove: the state directory, once nothing holds it, and the
    # shared-memory regions recorded there (a server stopped by its death signal leaves them); then,
    # with a prefix of the supervisor's own, any other of its regions (made before a command line named it)
    dirs, regions = leftovers.remove_abandoned_state_dirs()
    regions += leftovers.unlink_regions(leftovers.own_regions(prefix))
    if killed or dirs:
        log(f"guard: the supervisor is gone; killed {len(killed)} process(es) its server left"
            f"{': ' + str(killed) if killed else ''}; removed {', '.join(dirs) or 'no directory'} and "
            f"{len(regions)} shared-memory region(s)")
    return killed


def _clear(pgid: int, exit_timeout: float, prefix: str) -> list[int]:
    """Wait for the server's exit and its model processes', then kill those left -> their pids."""
    # The server's own stop, as TritonServer.stop waits for it. Linux does not give the group's id
    # to a new process while the group has a member: only an empty group's could be another's.
    end = time.monotonic() + exit_timeout + 10
    while time.monotonic() < end:
        members = groups.alive(pgid)
        if not members:
            return []
        if pgid not in members:  # tritonserver is gone; its model processes are left
            break
        time.sleep(POLL_S)
    left = groups.wait(pgid, 5)
    if not left:
        return []
    regions = leftovers.shm_regions(groups.commands_of(pgid), prefix)
    if not groups.kill(pgid):
        return []
    groups.wait(pgid, 5)
    leftovers.unlink_regions(sorted(regions))
    return left


def main(argv: list[str]) -> int:
    pgid, supervisor, exit_timeout, prefix = int(argv[0]), int(argv[1]), float(argv[2]), argv[3]
    guard(pgid, supervisor, exit_timeout, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
