"""What the model processes of one tritonserver share on disk, outside Triton: a private directory,
the secret that marks the orchestrators' internal calls, and the LoRA set a restart keeps.

Every model process is a child of the tritonserver process, so `os.getppid()` names the server; the
directory is keyed by it and created 0700 (unless VOXCPM_RUN_DIR names one, as the supervisor
does, which removes it after). A plain tritonserver's model processes hold their directory with a
lock while they run, note their shared-memory regions in it, and remove, as they start, those of
servers that have exited and nobody holds, with the regions noted there (`runtime.model_process`).
No torch here: the orchestrator processes import this too.

- Internal key: `VOXCPM_INTERNAL_KEY` when set (the supervisor sets a fresh one per start),
  else a random key that the first process of this server writes into the directory (atomically:
  written aside, then hard-linked; a loser of the race reads the winner's). Internal models refuse
  requests that do not carry it.
- LoRA set: under a supervisor, the decoder keeps the names of its loaded adapters in
  `VOXCPM_STATE_DIR` (the supervisor's, kept across its restarts), where the next server reads them.
"""

from __future__ import annotations

import fcntl
import functools
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
from stat import S_ISDIR

from . import processes

log = logging.getLogger("voxcpm_triton.run_state")

KEY_PARAMETER = "voxcpm_internal_key"


@functools.cache
def _server_id() -> str:
    """The parent tritonserver's pid and start time: unique even where pids are reused. Once per process: a
    model process whose server died must not make a directory for its new parent in its last second."""
    ppid = os.getppid()
    try:
        return f"{ppid}-{processes.proc_fields(ppid)[19]}"
    except (OSError, ValueError, IndexError):
        return str(ppid)


def run_dir() -> str:
    path = os.environ.get("VOXCPM_RUN_DIR") or os.path.join(tempfile.gettempdir(), f"voxcpm-{_server_id()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


# run_dir()'s name without VOXCPM_RUN_DIR, and one a sweep (the last pid) took to remove
_DEFAULT_RUN_DIR = re.compile(r"voxcpm-(\d+)(?:-(\d+))?(?:\.removing-(\d+))?")
HELD_FILE = "held"  # in a default run directory: each of its server's model processes holds a shared lock on it
_held_fd: int | None = None


def hold_run_dir():
    """Hold a shared lock on this server's default run directory while this process runs (released by the
    kernel when it ends). Another server removes only a directory nobody holds: a pid and a start time
    alone cannot tell a live server in another pid namespace sharing the same /tmp from a dead one."""
    global _held_fd
    if _held_fd is None:
        fd = os.open(os.path.join(run_dir(), HELD_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held_fd = fd


def remove_unheld(path: str, held_file_required: bool = False, on_claimed=None) -> bool:
    """Remove the directory `path` unless a process holds its `held` file locked (`hold_run_dir`, or a
    supervisor's state directory); one of several processes sweeping at once does
    it. A directory without the file counts as unheld, or, with `held_file_required`, is left; so is one
    whose lock cannot be tried (a filesystem without flock). `on_claimed(claimed_path)` runs once the
    directory is this call's, before it is removed. True if this call removed it."""
    try:
        fd = os.open(os.path.join(path, HELD_FILE), os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        if held_file_required:
            return False
        fd = None  # its processes never got as far (or are older than the lock): nobody holds it
    except OSError:
        return False
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held (EWOULDBLOCK), or no locks here: either way, not known to be free
                return False
        claimed = f"{path}.removing-{os.getpid()}"
        try:
            os.rename(path, claimed)  # atomic: the one sweeper that wins removes it, and says so
        except OSError:
            return False
        if on_claimed is not None:
            on_claimed(claimed)
        shutil.rmtree(claimed, ignore_errors=True)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def own_dirs(parent: str, pattern: re.Pattern):
    """(match, path) for each directory in `parent` (not a link to one) whose whole name matches
    `pattern` and that belongs to this user."""
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if not m:
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            yield m, path


def remove_stale_run_dirs(parent: str | None = None) -> list[str]:
    """Remove the default run directories (`<tmp>/voxcpm-<pid>-<start time>`, run_dir()'s without
    VOXCPM_RUN_DIR) of servers that have exited, and return those this call removed. Nothing else removes
    them: a tritonserver run without the supervisor leaves its directory, internal key included,
    however it ends. Only directories of this user, whose server's pid is gone (or another process's now)
    and which no process holds (`hold_run_dir`)."""
    removed = []
    for m, path in own_dirs(parent or tempfile.gettempdir(), _DEFAULT_RUN_DIR):
        if m[3] is not None:  # claimed by a sweep that died while removing it, unless it still runs
            if not processes.process_alive(int(m[3])):
                _unlink_noted_regions(path)
                shutil.rmtree(path, ignore_errors=True)
        elif not processes.process_alive(int(m[1]), m[2]) and remove_unheld(path, on_claimed=_unlink_noted_regions):
            removed.append(path)
    return removed


REGION_NOTE = "shm."  # + pid, in a default run directory: that model process's shared-memory region's name


def note_region():
    """In a stub: write this process's shared-memory region's name (its command line's second argument,
    as python_backend launches a stub) into the default run directory. A server killed with its model
    processes leaves its regions in /dev/shm; the sweep that removes its directory removes them too."""
    if not processes.in_stub():
        return
    with open("/proc/self/cmdline", "rb") as f:
        args = f.read().decode(errors="replace").split("\0")
    if len(args) > 2 and args[2] and "/" not in args[2]:
        write_atomic(os.path.join(run_dir(), f"{REGION_NOTE}{os.getpid()}"), args[2])


def _unlink_noted_regions(claimed: str):
    """The regions a dead server's model processes noted (note_region), unlinked: nobody holds its
    directory, so none of them runs."""
    try:
        names = os.listdir(claimed)
    except OSError:
        return
    for name in names:
        if not name.startswith(REGION_NOTE):
            continue
        try:
            with open(os.path.join(claimed, name), encoding="utf-8", errors="replace") as f:
                region = f.read().strip()
            if region and "/" not in region and region not in (".", ".."):
                os.unlink(os.path.join("/dev/shm", region))
        except OSError:
            pass


def run_dir_realpath() -> str:
    """run_dir()'s real path, worked out once per run directory setting and parent server: a
    caller's inbox is checked against it for every request (bls.callee.counting_sender)."""
    return _run_dir_realpath(os.environ.get("VOXCPM_RUN_DIR"), tempfile.gettempdir(), os.getppid())


@functools.lru_cache(maxsize=8)
def _run_dir_realpath(_env, _tmp, _ppid) -> str:  # the arguments are what run_dir() depends on
    return os.path.realpath(run_dir())


def write_atomic(path: str, text: str):
    """`text` into `path`, written aside and renamed over it: a reader sees the old file or the new."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


LORAS_FILE = "loras.json"  # in VOXCPM_STATE_DIR: the LoRA adapters loaded, by name


def saved_loras() -> list | None:
    """The LoRA adapters the decoder had loaded when this supervisor's previous server stopped
    (`save_loras`), or None: no supervisor (VOXCPM_STATE_DIR), or nothing saved yet."""
    state = os.environ.get("VOXCPM_STATE_DIR")
    try:
        with open(os.path.join(state, LORAS_FILE), encoding="utf-8") as f:
            names = json.load(f)["loaded"]
    except (TypeError, OSError, ValueError, KeyError):
        return None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else None


def save_loras(names: list):
    """Keep the names of the LoRA adapters loaded now where the supervisor's next server reads them:
    a restart after a crash serves the adapters added and removed at run time, not the directory's
    first `max_loras`."""
    state = os.environ.get("VOXCPM_STATE_DIR")
    if not state:
        return
    path = os.path.join(state, LORAS_FILE)
    try:
        write_atomic(path, json.dumps({"loaded": list(names)}))
    except OSError as e:
        log.warning("could not keep the loaded LoRA adapters for a restart (%s): %s", path, e)


def internal_key() -> str:
    env = os.environ.get("VOXCPM_INTERNAL_KEY")
    if env:
        return env
    path = os.path.join(run_dir(), "internal.key")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def key_matches(parameters_json: str, key: str) -> bool:
    """True if a request's parameters (Triton's JSON string) carry the internal key."""
    try:
        given = json.loads(parameters_json or "{}").get(KEY_PARAMETER, "")
    except (ValueError, AttributeError):
        return False
    return isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode())
