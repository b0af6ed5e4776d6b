"""What the model processes of one tritonserver share, outside Triton: a private directory,
the secret that marks the orchestrator's internal calls, liveness beacons, and the LoRA set a
restart keeps.

Every model process is a child of the tritonserver process, so `os.getppid()` names the
server; the directory is keyed by it and created 0700 (unless VOXCPM_RUN_DIR names one, as
scripts/supervise.py does, which removes it after). A plain tritonserver's model processes hold
their directory with a lock while they run, note their shared-memory regions in it, and remove, as
they start, those of servers that have exited and nobody holds, with the regions noted there.
No torch here: the orchestrator processes import this too.

- LoRA set: under a supervisor, the decoder keeps the names of its loaded adapters in
  `VOXCPM_STATE_DIR` (the supervisor's, kept across its restarts), where the next server reads them.
- Internal key: `VOXCPM_INTERNAL_KEY` when set (scripts/supervise.py sets a fresh one per
  start), else a random key that the first process of this server writes into the
  directory (atomically: written aside, then hard-linked; a loser of the race reads the
  winner's). Internal models refuse requests that do not carry it.
- Beacons: each model process (`WATCHED_MODELS`) writes `<model>.<pid>.json` every second
  ({pid, beat, error, busy}); `error` is set when the process knows it can no longer serve (the
  engine thread died). Triton 2.51 neither restarts a dead stub nor reports it, so the
  orchestrator reads the beacons to fail fast instead of waiting forever. `busy`: the requests
  its executes (`counted`) hold now; the supervisor reads it while the server stops.
- Parent watch: a model process whose tritonserver is gone exits at once, so nothing of
  a server outlives it; one that crashes leaves its threads' stacks in the server's log.
- Exit: a model process ends with os._exit once its interpreter starts to shut down, after
  its finalize and the exit handlers registered after `exit_without_teardown` (each model.py
  calls it first): the interpreter's teardown aborts a process whose daemon thread is inside a
  torch op.
- Stopping: scripts/supervise.py writes `stopping` (a time, epoch seconds) before it sends
  SIGTERM. Triton 2.51 tells a model nothing until its finalize, which waits for its requests:
  from then on the orchestrators take no new request, and at that time the decoder ends the
  ones it still runs with an error, so that every model unloads before the server's exit
  timeout cuts them all off.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import fcntl
import functools
import hmac
import inspect
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from stat import S_ISDIR

log = logging.getLogger("voxcpm_triton.runtime")

KEY_PARAMETER = "voxcpm_internal_key"
BEACON_PERIOD_S = 1.0
# A beacon older than this means its process is stuck or gone (the engine loop wakes every
# 50 ms even when idle; one CPU prefill of the largest prompt takes a few seconds).
BEACON_STALE_S = 15.0
INTERNAL_MODELS = ("text_normalizer", "tokenizer", "vae_encoder", "vae_decoder", "decoder")
# Every model writes a beacon: the Python backend of Triton 2.51 does not restart a dead model
# process, whose requests then fail (or hang, if it died with some in flight) until the server is
# restarted. A dead one anywhere makes every request fail as unhealthy, and the supervisor restarts it.
WATCHED_MODELS = (*INTERNAL_MODELS, "tts", "tts_stream", "voices", "loras")


STOPPING_FILE = "stopping"  # scripts/supervise.py writes it
STOPPING_READ_S = 0.25  # how stale a read of it may be: requests ask once per chunk
_stop_read = (float("-inf"), None)  # (monotonic time of the read, deadline)


def stop_deadline() -> float | None:
    """The time (epoch seconds) by which running requests must end, once the server is stopping;
    None while it serves. A server whose supervisor has died is stopping now: its tritonserver got
    SIGTERM (the supervisor's death signal), and nobody wrote the deadline."""
    global _stop_read
    now = time.monotonic()
    if now - _stop_read[0] >= STOPPING_READ_S:
        try:
            with open(os.path.join(run_dir(), STOPPING_FILE), encoding="ascii") as f:
                deadline = float(f.read())
        except (OSError, ValueError):
            deadline = None
        supervisor = os.environ.get("VOXCPM_SUPERVISOR_PID", "")
        if deadline is None and supervisor.isdigit() and not process_alive(int(supervisor)):
            deadline = time.time()
        _stop_read = (now, deadline)
    return _stop_read[1]


def stopping(now: float | None = None) -> bool:
    """True once the server's stop deadline has come: requests still running end."""
    deadline = stop_deadline()
    return deadline is not None and (time.time() if now is None else now) >= deadline


def _proc_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name: the state first, the start time at [19]."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        line = f.read()
    return line[line.rindex(")") + 2:].split()


@functools.cache
def _server_id() -> str:
    """The parent tritonserver's pid and start time: unique even where pids are reused. Once per process: a
    model process whose server died must not make a directory for its new parent in its last second."""
    ppid = os.getppid()
    try:
        return f"{ppid}-{_proc_fields(ppid)[19]}"
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
    supervisor's state directory, scripts/supervise.py); one of several processes sweeping at once does
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
    them: a tritonserver run without scripts/supervise.py leaves its directory, internal key included,
    however it ends. Only directories of this user, whose server's pid is gone (or another process's now)
    and which no process holds (`hold_run_dir`)."""
    removed = []
    for m, path in own_dirs(parent or tempfile.gettempdir(), _DEFAULT_RUN_DIR):
        if m[3] is not None:  # claimed by a sweep that died while removing it, unless it still runs
            if not process_alive(int(m[3])):
                _unlink_noted_regions(path)
                shutil.rmtree(path, ignore_errors=True)
        elif not process_alive(int(m[1]), m[2]) and remove_unheld(path, on_claimed=_unlink_noted_regions):
            removed.append(path)
    return removed


REGION_NOTE = "shm."  # + pid, in a default run directory: that model process's shared-memory region's name


def note_region():
    """In a stub: write this process's shared-memory region's name (its command line's second argument,
    as python_backend launches a stub) into the default run directory. A server killed with its model
    processes leaves its regions in /dev/shm; the sweep that removes its directory removes them too."""
    if not in_stub():
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
    caller's inbox is checked against it for every request (bls_stream.counting_sender)."""
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


_busy = 0  # requests inside this process's counted executes
_busy_lock = threading.Lock()


def _add_busy(n: int):
    global _busy
    with _busy_lock:
        _busy += n


def busy() -> int:
    """Requests this process's executes hold now (`counted`)."""
    return _busy


def counted(execute):
    """A model's `execute` (plain or async) whose requests count as busy while it runs. An
    orchestrator's execute lasts as long as its requests; a decoupled model that holds requests
    past its execute (the decoder) adds them through its Beacon's `work`."""
    if inspect.iscoroutinefunction(execute):
        @functools.wraps(execute)
        async def run_async(self, requests):
            _add_busy(len(requests))
            try:
                return await execute(self, requests)
            finally:
                _add_busy(-len(requests))
        return run_async

    @functools.wraps(execute)
    def run(self, requests):
        _add_busy(len(requests))
        try:
            return execute(self, requests)
        finally:
            _add_busy(-len(requests))
    return run


class Beacon:
    """Writes this process's beacon every second until `stop`. `status()` -> None when healthy,
    else a reason (written as the beacon's error)."""

    def __init__(self, model: str, status=lambda: None, period_s: float = BEACON_PERIOD_S, work=lambda: 0):
        self.path = os.path.join(run_dir(), f"{model}.{os.getpid()}.json")
        self.status, self.period, self.work = status, period_s, work  # work: requests held past execute
        self._stop = threading.Event()
        self.write()
        self._thread = threading.Thread(target=self._run, name=f"beacon-{model}", daemon=True)
        self._thread.start()

    def write(self):
        try:
            error = self.status()
        except Exception as e:  # noqa: BLE001 - a broken status check is itself a failure
            error = f"status check failed: {e}"
        try:
            held = busy() + self.work()
        except Exception:  # noqa: BLE001 - unknown counts as busy
            held = 1
        write_atomic(self.path, json.dumps({"pid": os.getpid(), "beat": time.time(), "error": error,
                                            "busy": held}))

    def _run(self):
        while not self._stop.wait(self.period):
            try:
                self.write()
            except OSError:
                log.exception("writing the liveness beacon %s failed", self.path)

    def stop(self):
        self._stop.set()
        # A write under way would put the file back after the unlink (a dead pid's beacon, read as
        # "has died"); a stuck status check must not hold up finalize for long either.
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            os.unlink(self.path)
        except OSError:
            pass


def thread_stacks() -> str:
    """Every thread's Python stack, for a log line when something is stuck."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def process_alive(pid: int, start: str | None = None) -> bool:
    """False once process `pid` has exited (gone, a zombie, or, given its `start` time (/proc's clock
    ticks), its pid reused by a process started at another time). A process whose state cannot be read
    (out of file descriptors, say) counts as alive: taking a live process for dead stops its work."""
    try:
        fields = _proc_fields(pid)
        state = fields[0]
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        return True
    if state in ("Z", "X"):
        return False
    return start is None or len(fields) <= 19 or fields[19] == start


def _beacons(directory: str, models) -> list[tuple[str, str, dict]]:
    """(file name, model, contents with an int pid) of each beacon of `models` in `directory` that
    reads whole; one being replaced right now is left out. OSError if the directory cannot be listed."""
    out = []
    for name in os.listdir(directory):
        model, _, rest = name.partition(".")
        if model not in models or not rest.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                b = json.load(f)
            b["pid"] = int(b["pid"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        out.append((name, model, b))
    return out


def beacon_fault(models=WATCHED_MODELS, now: float | None = None,
                 directory: str | None = None) -> tuple[str, str] | None:
    """None if every beacon of `models` in this server's directory (`directory`: another server's,
    the supervisor's view) is fresh, from a live process and error-free; else (kind, why), kind one of
    "unreadable" (the directory), "dead", "error" (the process says it cannot serve) or "stale". A
    dead or broken process is named before a stale beacon, which may be a clock step. A model with
    no beacon yet counts as healthy (it is loading, or not part of this repository)."""
    now = time.time() if now is None else now
    directory = directory or run_dir()
    try:
        beacons = _beacons(directory, models)
    except OSError as e:
        return "unreadable", f"cannot read the server's runtime directory: {e}"
    stale = None
    for _, model, b in beacons:
        pid, error = b["pid"], b.get("error")
        try:
            beat = float(b["beat"])
        except (ValueError, TypeError, KeyError):
            continue
        if not process_alive(pid):
            return "dead", f"the {model} model process (pid {pid}) has died"
        if error:
            return "error", f"the {model} model cannot serve: {error}"
        if stale is None and now - beat > BEACON_STALE_S:
            stale = "stale", f"the {model} model process (pid {pid}) has not answered for {now - beat:.0f} s"
    return stale


def busy_beacons(directory: str, models=WATCHED_MODELS) -> dict[str, int] | None:
    """{beacon file name: requests it says its process holds} for each live model process of a
    server (`directory`: its runtime directory); None if the directory cannot be read. A beacon
    without a count counts as busy."""
    try:
        beacons = _beacons(directory, models)
    except OSError:
        return None
    out = {}
    for name, _, b in beacons:
        if process_alive(b["pid"]):
            count = b.get("busy")
            out[name] = count if isinstance(count, int) else 1
    return out


def unhealthy(models=WATCHED_MODELS, now: float | None = None) -> str | None:
    """beacon_fault's reason, for this server's directory; None when healthy."""
    fault = beacon_fault(models, now)
    return None if fault is None else fault[1]


def model_process():
    """What every model process does first: leave every thread's Python stack in the server's log
    if it crashes (Triton 2.51 reports a dead stub only as "not healthy") or on SIGUSR2, and exit with
    its server. In a server run without VOXCPM_RUN_DIR (a plain tritonserver): hold its default run
    directory, note its shared-memory region there, and remove those directories (and the regions
    noted in them) that servers which have exited left behind."""
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # `kill -USR2 <pid>`: every thread's stack, now
    watch_parent()
    if os.environ.get("VOXCPM_RUN_DIR"):  # a server under the supervisor (or a test's): it removes its own
        return
    try:  # best effort: a server serves without it
        hold_run_dir()
        note_region()
        for path in remove_stale_run_dirs():
            log.warning("removed %s, the run directory of a server that has exited", path)
    except Exception:  # noqa: BLE001
        log.exception("holding this server's run directory, or removing those of servers that exited, failed")


STUB_EXECUTABLE = "triton_python_backend_stub"


def in_stub() -> bool:
    """Whether this process is a python_backend stub (a model process of a tritonserver)."""
    try:
        exe = os.readlink("/proc/self/exe").removesuffix(" (deleted)")  # a backend directory replaced since
    except OSError:
        return False
    return os.path.basename(exe) == STUB_EXECUTABLE


def exit_without_teardown():
    """In a stub process (elsewhere: nothing): end it with os._exit(0) once its interpreter starts
    to shut down, instead of tearing the interpreter down.

    By then the stub has finalized the model and let go of its shared memory, and the exit
    handlers registered after this one have run (call it before importing torch, whose handlers
    then run first). CPython's teardown (up to 3.13) ends every daemon thread that next takes the
    GIL with pthread_exit; one inside a C++ call that had released the GIL (any torch op) aborts
    the whole process ("terminate called without an active exception") and leaves a fatal error
    in the server's log. Skipped: the handlers registered before this one (logging's, whose work
    is done here), C-level atexit handlers and static destructors."""
    if in_stub():
        atexit.register(_exit_now, os.getpid())


def _exit_now(pid: int):
    if os.getpid() != pid:  # a forked child inherited the handler: it exits as it would have
        return
    try:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        ctypes.CDLL(None).fflush(None)  # the stub's own C stdio buffers
    finally:
        os._exit(0)


def watch_parent(period_s: float = 1.0):
    """Exit this process as soon as its tritonserver is gone (reparented): tritonserver's exit
    timeout or a crash would otherwise leave it running, holding its memory."""
    parent = os.getppid()

    def run():
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()
