"""What a server leaves when it or its supervisor is killed: its model processes' shared-memory
regions in /dev/shm, and the supervisor's state directory in the temporary directory."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile

from ..coordination import processes, run_state
from . import server_args
from .log import log

SHM_DIR = "/dev/shm"
STATE_PREFIX = "voxcpm-run-"  # tempfile.mkdtemp's: the prefix and 8 letters, digits or underscores
_STATE_DIR = re.compile(rf"{STATE_PREFIX}[A-Za-z0-9_]+(?:\.removing-(\d+))?")  # and one a sweep claimed
PYTHON_ENV_GLOB = "/tmp/python_env_*"  # the python backend's, one per server (mkdtemp, not TMPDIR)
REGIONS_FILE = "shm_regions"  # in the state directory: the running server's regions, a name a line


def shm_regions(commands: dict[int, list[str]], prefix: str) -> set[str]:
    """Shared-memory regions named on the command lines `commands` (groups.commands_of): the server gives
    each python backend model process its own region's name as an argument."""
    return {a for args in commands.values() for a in args if a.startswith(prefix) and "/" not in a}


def own_regions(prefix: str) -> list[str]:
    """The regions in /dev/shm named with `prefix` where it is a supervisor's own (server_args.OWN_PREFIX), else
    none. No other server names its regions so: once the supervisor's server has stopped, every one
    of them is left over, those no command line named yet included (a server stopped while it starts
    a model process can make that process's region first)."""
    if not server_args.OWN_PREFIX.fullmatch(prefix):
        return []
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except OSError:
        return []


def make_state_dir() -> tuple[str, int | None]:
    """A new state directory and the descriptor of its `held` file, locked (shared) before the file has
    its name: a sweep never finds the directory unheld while its supervisor lives. Each server gets the
    descriptor too, and its model processes from it, so the lock lasts until the last of them is gone.
    Where the filesystem has no locks the directory gets no `held` file (no sweep takes it) and None."""
    path = tempfile.mkdtemp(prefix=STATE_PREFIX)
    aside = os.path.join(path, f".{run_state.HELD_FILE}")
    fd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError as e:
        os.close(fd)
        os.unlink(aside)
        log(f"no lock on {path} ({e}): a supervisor started after this one is killed will not remove it")
        return path, None
    os.rename(aside, os.path.join(path, run_state.HELD_FILE))
    return path, fd


def record_regions(state_dir: str, regions: set[str]):
    """Keep the running server's regions in its state directory (recorded_regions reads them)."""
    run_state.write_atomic(os.path.join(state_dir, REGIONS_FILE), "".join(f"{r}\n" for r in sorted(regions)))


def recorded_regions(state_dir: str) -> list[str]:
    try:
        with open(os.path.join(state_dir, REGIONS_FILE), encoding="utf-8", errors="replace") as f:
            names = f.read().split()
    except OSError:
        return []
    return [n for n in names if "/" not in n and n not in (".", "..")]


def unlink_regions(names: list[str]) -> list[str]:
    """Unlink these regions from /dev/shm -> those that were there."""
    gone = []
    for r in names:
        try:
            os.unlink(os.path.join(SHM_DIR, r))
            gone.append(r)
        except FileNotFoundError:
            pass  # the server removed it as it stopped
        except OSError as e:
            log(f"could not remove {SHM_DIR}/{r}: {e}")
    return gone


def remove_abandoned_state_dirs(parent: str | None = None) -> tuple[list[str], list[str]]:
    """Remove the state directories of supervisors that were killed (SIGKILL leaves them in the
    temporary directory) once no process holds them: neither the supervisor nor anything of its server
    or companions. The shared-memory regions named in them that are still in /dev/shm go too: they are
    left when supervisor and server were both killed. Only this user's directories with a `held` file
    (make_state_dir); a lock, unlike a pid, holds across the pid namespaces that may share /tmp. Also
    finishes what a sweep that died while removing one left (`<dir>.removing-<its pid>`).
    -> (directories, regions) removed."""
    dirs, regions = [], []

    def regions_of(claimed: str):  # read once the directory is ours: nobody writes it any more
        regions.extend(unlink_regions(recorded_regions(claimed)))

    for m, path in run_state.own_dirs(parent or tempfile.gettempdir(), _STATE_DIR):
        if m[1] is not None:  # claimed by a sweep (renamed: nobody else uses it); done unless it still runs
            if not processes.process_alive(int(m[1])):
                regions_of(path)
                shutil.rmtree(path, ignore_errors=True)
                dirs.append(path)
        elif run_state.remove_unheld(path, held_file_required=True, on_claimed=regions_of):
            dirs.append(path)
    return dirs, regions
