#!/usr/bin/env python3
"""Run tritonserver and keep it serving: restart it when it exits, when a model process's beacon
says it died, stopped answering or cannot serve (checked every half second once it is ready,
probes or not), or when
the liveness probe (scripts/probe.py, a real tiny synthesis) says it is broken.

Triton 2.51's Python backend does not restart a model process that died, and its health
endpoints keep answering 200 afterwards; recovery has to come from outside. This is that
outside, for scripts/serve.sh and for the container. Standard library only (and the project's
voxcpm_triton.serving runtime, run_state, liveness and processes, which are too).

    python3 scripts/supervise.py [options] -- tritonserver --model-repository=... [args]

Each start gets a fresh VOXCPM_RUN_DIR (the models' shared directory, removed after the
server stops) and, unless already set, a fresh VOXCPM_INTERNAL_KEY. VOXCPM_STATE_DIR, the
directory those are made in, lives as long as the supervisor: what the models keep there
(the LoRA adapters loaded at run time) carries over a restart. Triton's shared-memory,
model-repository, logging and trace APIs are restricted to clients that send the header
`voxcpm-admin-key: $VOXCPM_ADMIN_KEY` (over gRPC, Triton prefixes it:
`triton-grpc-protocol-voxcpm-admin-key`); unset, the key is random, so nobody can use them.
Arguments that already restrict something are left as they are.

SIGTERM / SIGINT stop the server (SIGTERM, then SIGKILL to its whole process group 10 s after
its exit timeout) and exit; nothing the server started outlives it. First it writes the time
by which running requests must end, half the exit timeout away, to `stopping` in the run
directory: the orchestrators refuse new requests from then on, and the decoder ends those still
running at that time with an error (Triton 2.51 tells a model nothing before its finalize, which
waits for them); the other half is for the models to unload.

A server killed (SIGKILL after its grace period) leaves its model processes' shared-memory
regions in /dev/shm, since a killed process removes nothing: each restart after a crash would
leave more, until the server could not start. So the supervisor notes the regions named on the
model processes' command lines while the server runs and removes those left once its whole
process group is gone. It keeps their names in the state directory too, which it and every process
of its server hold (a lock): a supervisor starting up removes the state directories nobody holds
any more, those of killed supervisors, with the regions their servers left if killed too.

A start that does not serve (never ready: a bad checkpoint; or broken before it passed a probe) is
retried with a growing pause; after `--max-failed-starts` of them in a row, or as many exits in a row
of a companion within a minute of its start (a setting it refuses), the supervisor stops everything
and exits 1, so that a container's restart policy or a person sees it. It starts a server only when
the server's ports are free, so it never takes another server's answers for its own; one held by
another process (a server still draining) is waited for up to `--start-timeout`.

`--companion CMD` (repeatable; CMD one shell-quoted command line) runs a process beside the
server, such as the OpenAI API gateway (scripts/serve.sh): started with it, restarted when it
exits (backing off while it keeps failing), left running while the server restarts, and stopped
with it. Each of its starts gets a TMPDIR of its own in the state directory, removed once that
start's processes are gone, however it ended.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import glob
import http.client
import math
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, os.path.join(os.path.dirname(SCRIPTS), "python_backend"))  # this checkout's, stdlib only
import probe  # noqa: E402
from voxcpm_triton.serving import liveness, processes, run_state, runtime  # noqa: E402

RESTRICTED_APIS = "shared-memory,model-repository,logging,trace"
ADMIN_HEADER = "voxcpm-admin-key"
STALE_CONFIRM_S = 3.0  # a beacon found stale must stay so this long (its process beats every second)
BROKEN_GRACE_S = 5.0  # what a server being restarted gets after SIGTERM before SIGKILL
PROBE_JOIN_S = 5.0  # what a probe cut short gets to end once its server is gone
HELD_IDLE_S = 5.0  # a stopping server whose model processes all stay idle and loaded this long is held
DEAD_MODEL = "dead model"  # _probe's status when a model process was found dead while it ran
SHM_PREFIX = "triton_python_backend_shm_region_"  # the python backend's shm-region-prefix-name by default
SHM_DIR = "/dev/shm"
UNIX_PATH_MAX = 107  # an AF_UNIX socket path's bytes
STATE_PREFIX = "voxcpm-run-"  # tempfile.mkdtemp's: the prefix and 8 letters, digits or underscores
_STATE_DIR = re.compile(rf"{STATE_PREFIX}[A-Za-z0-9_]+(?:\.removing-(\d+))?")  # and one a sweep claimed
PYTHON_ENV_GLOB = "/tmp/python_env_*"  # the python backend's, one per server (mkdtemp, not TMPDIR)
REGIONS_FILE = "shm_regions"  # in the state directory: the running server's regions, a name a line


def log(msg: str):
    print(f"[supervise {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def restricted(server_args: list[str]) -> list[str]:
    """The server's command with the restricted-API flags (VOXCPM_ADMIN_KEY, else a random key) added,
    unless it restricts something already."""
    if any(a.startswith(("--http-restricted-api", "--grpc-restricted-protocol")) for a in server_args):
        return list(server_args)
    key = os.environ.get("VOXCPM_ADMIN_KEY") or secrets.token_hex(16)
    if not os.environ.get("VOXCPM_ADMIN_KEY"):
        log(f"{RESTRICTED_APIS} APIs closed (set VOXCPM_ADMIN_KEY and send the header {ADMIN_HEADER} to use them)")
    return [*server_args, f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={key}",
            f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={key}"]


def _arg(args: list[str], name: str, default: str) -> str:
    """The value of option --name (`--name=value` or `--name value`), the last one given; else default."""
    value = default
    for i, a in enumerate(args):
        if a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
        elif a == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def _ports(args: list[str]) -> list[tuple[str, str, int]]:
    """(name, address, port) of each endpoint the server will listen on, from its arguments (Triton's
    defaults where they say nothing)."""
    out = []
    http_address = _arg(args, "http-address", "0.0.0.0")
    defaults = {"http": ("0.0.0.0", "8000"), "grpc": ("0.0.0.0", "8001"), "metrics": (http_address, "8002")}
    for name, (address, port) in defaults.items():
        if _arg(args, f"allow-{name}", "true").lower() in ("false", "0", "no", "off"):
            continue
        address = _arg(args, f"{name}-address", address)
        if address.startswith("ipv6:"):  # evhtp's spelling of an IPv6 address
            address = address[5:]
        try:
            out.append((name, address.strip("[]"), int(_arg(args, f"{name}-port", port))))
        except ValueError:
            continue  # the server reports a malformed port itself
    return out


def _taken(ports: list[tuple[str, str, int]]) -> list[str]:
    """The endpoints whose port another process listens on. Only EADDRINUSE counts: an address this
    host does not have, a privileged port, a name that does not resolve are the server's to report."""
    taken = []
    for name, host, port in ports:
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is no holder
                s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                taken.append(f"{name} {host}:{port}")
    return taken


CLAIM = "voxcpm-serving-port-"  # an abstract Unix socket's name: CLAIM<port>-<address>
_WILDCARDS = ("", "0.0.0.0", "::")


def _addresses(host: str) -> set[str]:
    """The addresses `host` names, as one spelling each ("*": every address, also for a name that does
    not resolve): localhost, 127.1 and 127.0.0.1 are one claim."""
    if host in _WILDCARDS:
        return {"*"}
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return {"*"}
    found = {info[4][0].split("%", 1)[0] for info in infos}
    return {"*"} if found & set(_WILDCARDS) else found or {"*"}


def _claimed(port: int) -> set[str]:
    """The addresses claimed on `port` (_claim), from the kernel's list of Unix sockets."""
    head = f"@{CLAIM}{port}-"
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            return {name[len(head):] for line in f if (name := line.split()[-1]).startswith(head)}
    except OSError:
        return set()


def _claim(ports: list[tuple[str, str, int]]) -> tuple[list[socket.socket], list[str]]:
    """Claim the server's ports for this supervisor's life: -> (the claims, held while they are open;
    the endpoints another supervisor claimed, with nothing claimed then). Triton listens only once its
    models have loaded: until then a second supervisor found the ports free, started a server of its
    own and took the first one's readiness for its own. A claim is an abstract Unix socket's name
    (port and address), which leaves no file and goes with the process however it ends. A port claimed
    on another address does not conflict, except where either address is a wildcard (checked once
    the claim is made: of two supervisors claiming at once, at least one sees the other)."""
    claims, held, names = [], [], set()
    for name, host, port in ports:
        for address in sorted(_addresses(host)):
            if (port, address) in names:  # one port listed twice (a companion's, say): one claim
                continue
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind(f"\0{CLAIM}{port}-{address}")
            except OSError:
                s.close()
                held.append(f"{name} {host}:{port} (another supervisor's server)")
                break
            claims.append(s)
            names.add((port, address))
            others = _claimed(port) - {a for p, a in names if p == port}
            if others and (address == "*" or "*" in others):
                held.append(f"{name} {host}:{port} (another supervisor's server, on {', '.join(sorted(others))})")
                break
    if held:
        for s in claims:
            s.close()
        return [], held
    return claims, []


def _group_alive(pgid: int) -> list[int]:
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


def _wait_group(pgid: int, seconds: float) -> list[int]:
    """Wait up to `seconds` for the group's processes to end; -> those still alive."""
    deadline = time.monotonic() + seconds
    while (left := _group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _only_beacon_models(args: list[str]) -> bool:
    """True if every model in the server's repositories is one of this project's, each of whose
    processes writes a beacon with its busy count (liveness.WATCHED_MODELS)."""
    repos = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
    repos += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model-repository"]
    try:
        models = {m for r in repos for m in os.listdir(r) if os.path.isdir(os.path.join(r, m))}
    except OSError:
        return False
    return bool(repos) and models <= set(liveness.WATCHED_MODELS)


def _shm_prefix(args: list[str]) -> str:
    """The python backend's region prefix: its backend config's shm-region-prefix-name, else the default."""
    for a in args:
        if a.startswith("--backend-config=python,shm-region-prefix-name="):
            return a.split("=", 2)[2]
    return SHM_PREFIX


def _args(pid: int) -> list[str]:
    """Process `pid`'s command line; [] if it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _group_commands(pgid: int) -> dict[int, list[str]]:
    """The group's live processes and their command lines: one /proc scan serves all that is read from them."""
    return {pid: _args(pid) for pid in _group_alive(pgid)}


def _stub_pids(commands: dict[int, list[str]]) -> list[int]:
    """The python backend model processes among `commands` (_group_commands)."""
    return [pid for pid, args in commands.items() if os.path.basename((args or [""])[0]) == processes.STUB_EXECUTABLE]


def _shm_regions(commands: dict[int, list[str]], prefix: str) -> set[str]:
    """Shared-memory regions named on the command lines `commands` (_group_commands): the server gives
    each python backend model process its own region's name as an argument."""
    return {a for args in commands.values() for a in args if a.startswith(prefix) and "/" not in a}


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


def _recorded_regions(state_dir: str) -> list[str]:
    try:
        with open(os.path.join(state_dir, REGIONS_FILE), encoding="utf-8", errors="replace") as f:
            names = f.read().split()
    except OSError:
        return []
    return [n for n in names if "/" not in n and n not in (".", "..")]


def _unlink_regions(names: list[str]) -> list[str]:
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
        regions.extend(_unlink_regions(_recorded_regions(claimed)))

    for m, path in run_state.own_dirs(parent or tempfile.gettempdir(), _STATE_DIR):
        if m[1] is not None:  # claimed by a sweep (renamed: nobody else uses it); done unless it still runs
            if not processes.process_alive(int(m[1])):
                regions_of(path)
                shutil.rmtree(path, ignore_errors=True)
                dirs.append(path)
        elif run_state.remove_unheld(path, held_file_required=True, on_claimed=regions_of):
            dirs.append(path)
    return dirs, regions


def _fds(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)


def _die_with_supervisor():
    """preexec_fn: the server gets SIGTERM if the supervisor dies first (even by SIGKILL), so no
    server outlives the process that was supposed to stop it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the SIGTERM handler below still stops it
        pass


class Companion:
    """A process run beside the server: restarted whenever it exits, on its own (the server is
    not restarted for it, nor it for the server). Each start gets a TMPDIR of its own in the state
    directory, removed once that start's process group is gone: what a companion killed by SIGKILL
    leaves there (the gateway's forkserver socket directory) goes then, not never."""

    def __init__(self, argv: list[str], state_dir: str | None = None, held_fd: int | None = None,
                 grace: float = 25.0, max_failures: int = 0):
        self.argv = argv
        self.max_failures = max_failures  # quick exits in a row after which it is not restarted (0: none)
        self.grace = grace  # SIGTERM to SIGKILL: its in-flight requests' time (--companion-grace)
        self.state_dir, self.held_fd = state_dir, held_fd
        self.tmp: str | None = None  # the running start's TMPDIR
        self.left: list[tuple[int, str | None]] = []  # ended starts' (process group, TMPDIR): removed once it is gone
        self.warned = False
        self.name = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else os.path.basename(argv[0])
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.due = 0.0  # when to start it next
        self.failures = 0  # exits in a row within a minute of the start (a setting it refuses, a held port)
        self.last_code: int | None = None

    def tend(self):
        """Start it when it is due; notice when it has exited."""
        now = time.monotonic()
        self._remove_left()
        if self.proc is not None:
            if self.proc.poll() is None:
                return
            self.left.append((self.proc.pid, self.tmp))
            up = now - self.started
            self.failures = 0 if up > 60 else self.failures + 1
            self.last_code = self.proc.returncode
            backoff = min(2.0 ** self.failures, 30.0)  # 1 s after a long run, doubling while it keeps failing
            if self.max_failures and self.failures >= self.max_failures:  # the supervisor gives up on it
                log(f"{self.name} exited with code {self.proc.returncode}")
                self.proc, self.due = None, math.inf
                return
            log(f"{self.name} exited with code {self.proc.returncode}; restarting in {backoff:.0f} s")
            self.proc, self.due = None, now + backoff
        if now >= self.due:
            self.tmp = self._make_tmp()
            env = None if self.tmp is None else dict(os.environ, TMPDIR=self.tmp)
            # it holds the state directory too: no sweep takes its TMPDIR while it runs
            self.proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_supervisor, pass_fds=_fds(self.held_fd))
            self.started = now
            log(f"{self.name} started (pid {self.proc.pid})")

    def terminate(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self):
        """SIGTERM, a grace period, then SIGKILL to what is left of its process group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not exit in time: SIGKILL")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        self.left.append((proc.pid, self.tmp))
        _wait_group(proc.pid, 5)
        self._remove_left()
        code = proc.returncode  # uvicorn ends on the SIGTERM it drained for, raised again: -15
        log(f"{self.name} stopped ({f'by {signal.strsignal(-code)}' if code < 0 else f'exit code {code}'})")

    def _make_tmp(self) -> str | None:
        """A TMPDIR for the next start in the state directory; None (the supervisor's own TMPDIR) where
        one there would make Python's multiprocessing socket paths (`<TMPDIR>/pymp-*/listener-*`, the
        gateway's upload decoders) longer than AF_UNIX allows."""
        if self.state_dir is None:
            return None
        longest = os.path.join(self.state_dir, "t" + "x" * 8, "pymp-" + "x" * 8, "listener-" + "x" * 8)
        if len(longest.encode()) > UNIX_PATH_MAX:
            if not self.warned:
                log(f"{self.name}: its TMPDIR stays {tempfile.gettempdir()}: one in {self.state_dir} would make its "
                    "socket paths too long, so what a SIGKILL leaves of it there stays")
                self.warned = True
            return None
        return tempfile.mkdtemp(prefix="t", dir=self.state_dir)

    def _remove_left(self):
        for pgid, tmp in list(self.left):
            if not _group_alive(pgid):
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                self.left.remove((pgid, tmp))


def _host_port(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def _url(host: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # a wildcard: the loopback
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Supervisor:
    def __init__(self, server_args: list[str], opts):
        self.opts = opts
        self.companion_argvs = [shlex.split(c) for c in getattr(opts, "companion", None) or []]
        self.companions: list[Companion] = []  # made by run(), with the state directory
        self.args = restricted(server_args)
        self.ports = _ports(self.args)
        _, host, port = next((p for p in self.ports if p[0] == "http"), ("http", "127.0.0.1", 8000))
        self.url = _url(host, port)
        metrics = next((p for p in self.ports if p[0] == "metrics"), None)
        self.metrics_url = _url(*metrics[1:]) if metrics else None  # a probe queued behind work counts as alive
        self.exit_timeout = float(_arg(self.args, "exit-timeout-secs", "30"))
        self.beacons_tell_all = _only_beacon_models(self.args)  # see _wait_exit
        # the companions' own ports: a start waits for them too (a gateway that cannot listen would
        # fail its starts beside a server that had loaded for nothing)
        self.ports += [("companion", *_host_port(a)) for a in getattr(opts, "companion_port", None) or []]
        if not self.beacons_tell_all:
            log("the model repository has models of its own (or cannot be read): a stopping server is left "
                "its whole exit timeout, never judged held")
        self.proc: subprocess.Popen | None = None
        self.guard: subprocess.Popen | None = None  # server_guard.py, beside the server
        self.run_dir: str | None = None
        self.stale_since: float | None = None  # when a stale beacon was first seen (_dead_model)
        self.probe_thread: threading.Thread | None = None  # the last probe's (_probe)
        self.envs_before: set[str] = set()  # the python backend's directories before this server started
        self.python_env: str | None = None  # and the one it made, if known
        self.state_dir: str | None = None  # the runs' parent, kept across restarts
        self.held_fd: int | None = None  # its `held` file, locked (make_state_dir)
        self.shm_prefix = _shm_prefix(self.args)
        self.regions: set[str] = set()  # the running server's model processes' shared-memory regions
        self.was_ready = self.was_healthy = False  # the current server: became ready, passed a probe
        self.stopping = False
        self.started_once = False  # companions start with the first server
        self.fatal: str | None = None  # why the supervisor gives up (exit 1)

    # ------------------------------------------------------------------ one server
    def start(self):
        if self.state_dir is None:
            self.state_dir, self.held_fd = make_state_dir()
        self.run_dir = tempfile.mkdtemp(prefix="run-", dir=self.state_dir)
        # VOXCPM_SUPERVISOR_PID: killed (SIGKILL), it cannot write `stopping`; the models then end their
        # requests themselves before tritonserver's forced exit (voxcpm_triton.serving.runtime.stop_deadline)
        env = dict(os.environ, VOXCPM_RUN_DIR=self.run_dir, VOXCPM_STATE_DIR=self.state_dir,
                   VOXCPM_SUPERVISOR_PID=str(os.getpid()))
        if not env.get("VOXCPM_INTERNAL_KEY"):
            env["VOXCPM_INTERNAL_KEY"] = secrets.token_hex(32)
        self.envs_before, self.python_env = set(glob.glob(PYTHON_ENV_GLOB)), None
        self.proc = subprocess.Popen(self.args, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_supervisor, pass_fds=_fds(self.held_fd))
        # what is left of the server if this process is killed (server_guard.py)
        self.guard = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "server_guard.py"), str(self.proc.pid),
                                       str(os.getpid()), str(self.exit_timeout), self.shm_prefix],
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.started, self.started_once = time.monotonic(), True
        self.was_ready = self.was_healthy = False
        self.stale_since = None
        log(f"tritonserver started (pid {self.proc.pid})")

    def stop(self, why: str, grace: float | None = None):
        """SIGTERM, wait `grace` (default: the server's exit timeout plus slack), then SIGKILL what is
        left of its group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.monotonic()
        self._note_regions(_group_commands(proc.pid))
        if proc.poll() is None:
            log(f"stopping tritonserver ({why})")
            drain = self.exit_timeout / 2 if grace is None else 0.0
            self._end_requests_by(time.time() + drain)
            proc.send_signal(signal.SIGTERM)
            late = self._wait_exit(proc, self.exit_timeout + 10 if grace is None else grace, drain)
            if late:
                log(f"{late}: SIGKILL")
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        left = _wait_group(proc.pid, 5)  # model processes end on their own once the server is gone
        if left:
            log(f"killing {len(left)} leftover process(es) of the server: {left}")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        left = _wait_group(proc.pid, 5)  # killed processes take a moment to go
        self._end_probe()
        self._end_guard()
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if left:
            log("some of the server's processes are still there: its shared-memory regions are left")
        else:
            self._remove_regions()
            if self.python_env:  # a server killed, or out of its exit timeout, leaves its (empty) directory
                try:
                    os.rmdir(self.python_env)
                except OSError:
                    pass  # gone with a clean exit, or not empty: not ours to clear
        log(f"tritonserver stopped in {time.monotonic() - t0:.1f} s (exit code {proc.returncode})")

    def _end_guard(self):
        """The stopped server's guard ends by itself once the server's group is empty; else it is killed."""
        guard, self.guard = self.guard, None
        if guard is None:
            return
        try:
            guard.wait(5)
        except subprocess.TimeoutExpired:
            guard.kill()
            guard.wait()

    def _wait_exit(self, proc: subprocess.Popen, seconds: float, drain: float = 0.0) -> str | None:
        """Wait up to `seconds` for a stopping server to exit; None if it did, else why to kill it:
        out of time, or held. Held: past `drain` (the time its requests were given: a request's
        responses may still be on their way to a slow reader, which keeps its model loaded), every
        model process left has reported no request for HELD_IDLE_S and none has unloaded or been
        unloading meanwhile (a process in its finalize has no beacon any more), so Triton is waiting
        for something that never ends. A gRPC stream cancelled while its last response is being
        written leaves Triton 2.51 holding that model for good, and the server would otherwise wait
        out its exit timeout (then exit 1). Only for a repository of this project's models, which all
        write beacons."""
        start = time.monotonic()
        end = start + seconds
        idle, idle_since = None, 0.0
        while True:
            try:
                proc.wait(max(0.0, min(0.5, end - time.monotonic())))
                return None
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= end:
                return "tritonserver did not exit in time"
            # not judged: a server stopped while it loads (models without a beacon yet)
            watch = self.run_dir and self.beacons_tell_all and self.was_ready
            beacons = liveness.busy_beacons(self.run_dir) if watch else None
            if not beacons or any(beacons.values()) or self._stubs_without_beacon(proc.pid, beacons):
                idle = None  # working, or a process finalizing (its beacon goes as its finalize starts)
            elif set(beacons) != idle:
                idle, idle_since = set(beacons), max(now, start + drain)
            elif now - idle_since >= HELD_IDLE_S:
                models = sorted({name.partition(".")[0] for name in idle})
                return (f"tritonserver still holds {', '.join(models)} {now - start:.0f} s after SIGTERM, every "
                        f"model process idle and nothing unloaded for {now - idle_since:.0f} s (one known cause: "
                        "a gRPC stream cancelled while its last response was being written)")

    def _note_python_env(self, commands: dict[int, list[str]]):
        """The python backend's directory this server made: the one that appeared since its start, if
        only one did (another server may have started meanwhile). Only once a model process of the
        server runs (the backend makes the directory before any): before, or in a server without
        python models, the one new directory may be another server's, which would be removed under it
        (Triton aborts at its exit when its directory is gone)."""
        if not _stub_pids(commands):
            return
        made = set(glob.glob(PYTHON_ENV_GLOB)) - self.envs_before
        self.python_env = made.pop() if len(made) == 1 else None

    @staticmethod
    def _stubs_without_beacon(pgid: int, beacons: dict[str, int]) -> bool:
        """True if a model process of the server writes no beacon (anymore): one in its finalize."""
        with_beacon = {name.split(".")[1] for name in beacons}
        return any(str(pid) not in with_beacon for pid in _stub_pids(_group_commands(pgid)))

    def _end_probe(self):
        """A probe cut short (a model process died meanwhile) fails once its server is gone; wait for it,
        so that it cannot reach the next server on the same port."""
        t, self.probe_thread = self.probe_thread, None
        if t is not None and t.is_alive():
            t.join(PROBE_JOIN_S)
            if t.is_alive():
                log(f"a probe of the stopped server is still running after {PROBE_JOIN_S:g} s")

    def _note_regions(self, commands: dict[int, list[str]]):
        """Add the regions the server's processes name now (`commands`: _group_commands); keep the list in
        the state directory, where the next supervisor finds it if this one and the server are killed
        (remove_abandoned_state_dirs)."""
        new = _shm_regions(commands, self.shm_prefix) - self.regions
        if new:
            self.regions |= new
            self._save_regions()

    def _save_regions(self):
        try:
            run_state.write_atomic(os.path.join(self.state_dir, REGIONS_FILE),
                                   "".join(f"{r}\n" for r in sorted(self.regions)))
        except OSError as e:
            log(f"could not note the server's shared-memory regions: {e}")

    def _remove_regions(self):
        """Remove the stopped server's shared-memory regions that are still there."""
        left = [r for r in sorted(self.regions) if os.path.exists(os.path.join(SHM_DIR, r))]
        for r in left:
            try:
                os.unlink(os.path.join(SHM_DIR, r))
            except OSError as e:
                log(f"could not remove {SHM_DIR}/{r}: {e}")
        if left:
            log(f"removed {len(left)} shared-memory region(s) the server's model processes left in {SHM_DIR}")
        self.regions = set()
        self._save_regions()

    def _end_requests_by(self, deadline: float):
        """The time from which the server's running requests end (voxcpm_triton.serving.runtime.stopping)."""
        if not self.run_dir:
            return
        tmp = os.path.join(self.run_dir, f".{runtime.STOPPING_FILE}")
        try:
            with open(tmp, "w", encoding="ascii") as f:
                f.write(repr(deadline))
            os.replace(tmp, os.path.join(self.run_dir, runtime.STOPPING_FILE))
        except OSError as e:
            log(f"could not tell the models the server is stopping: {e}")

    def ready(self) -> bool:
        return self._health("ready")

    def _health(self, which: str) -> bool:
        """Triton's /v2/health/<which> (ready, live) answered 200 within 2 s."""
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/{which}", timeout=2) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # (nohup: its terminal may close)
            signal.signal(signal.SIGHUP, self._on_signal)  # its terminal closed: stop as cleanly as on SIGTERM
        dirs, regions = remove_abandoned_state_dirs()
        if dirs:
            log(f"removed what {len(dirs)} killed supervisor(s) left: {', '.join(dirs)}"
                + (f", and {len(regions)} shared-memory region(s) of their servers" if regions else ""))
        self.state_dir, self.held_fd = make_state_dir()
        self.companions = [Companion(argv, self.state_dir, self.held_fd, self.opts.companion_grace,
                                     self.opts.max_failed_starts)
                           for argv in self.companion_argvs]
        backoff = 1.0
        failed = 0  # starts in a row that never served
        held_since = held_logged = 0.0  # another process holds a port: since when, when last said
        held: list[str] = []
        claims: list[socket.socket] = []
        while not self.stopping:
            elsewhere = []
            if not claims:
                claims, elsewhere = _claim(self.ports)
            # the companions run on across the server's restarts: their ports are checked before the first start
            ports = [p for p in self.ports if p[0] != "companion" or not self.started_once]
            taken = elsewhere or _taken(ports)
            if taken:
                # A server that is still stopping (the one a killed supervisor left) holds them for up to
                # its exit timeout: wait for them as long as a start may take, without counting starts.
                now = time.monotonic()
                if not held:
                    held_since = now
                if taken != held or now - held_logged >= 30:
                    log(f"not starting: port in use by another process: {', '.join(taken)} (checking every 2 s)")
                    held, held_logged = taken, now
                if now - held_since > self.opts.start_timeout:
                    self.fatal = f"port in use by another process: {', '.join(taken)}, for {now - held_since:.0f} s"
                    break
                self._sleep(2.0 + random.random() / 2)  # two claiming at once, each backing off: not in step
                continue
            held = []
            self.start()
            reason = self.watch()
            if self.stopping:
                break
            up = time.monotonic() - self.started
            # A broken server's requests to its dead model never finish: don't wait out its exit timeout.
            self.stop(reason, grace=BROKEN_GRACE_S)
            if self.stopping:
                break
            # Served: passed a probe (became ready, without probes). A start that breaks before that
            # counts as failed: a model that loads but cannot synthesize would restart forever.
            served = self.was_healthy or (self.was_ready and self.opts.probe_interval <= 0)
            failed = 0 if served else failed + 1
            if self.opts.max_failed_starts and failed >= self.opts.max_failed_starts:
                self.fatal = (f"{failed} start(s) in a row did not serve (never ready, or never passed a probe); "
                              f"the last: {reason}")
                break
            backoff = 1.0 if served and up > 60 else min(backoff * 2, 30.0)  # a crash loop backs off
            log(f"restarting in {backoff:.0f} s: {reason}")
            self._sleep(backoff)
        self._shutdown()
        for c in claims:  # the server is gone: its ports are free for another supervisor
            c.close()
        if self.fatal:
            log(f"giving up: {self.fatal}")
            return 1
        return 0

    def _shutdown(self):
        """Stop the server and the companions, which drain their requests at the same time."""
        for c in self.companions:
            c.terminate()
        self.stop(f"giving up: {self.fatal}" if self.fatal else "asked to stop")
        for c in self.companions:
            c.stop()
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            if self.held_fd is not None:
                os.close(self.held_fd)

    def watch(self) -> str:
        """Wait until the server must be restarted; -> why."""
        o = self.opts
        ready_since = None
        failures = 0
        next_probe = 0.0
        next_scan = 0.0
        while not self.stopping:
            if self.proc.poll() is not None:
                return f"tritonserver exited with code {self.proc.returncode}"
            now = time.monotonic()
            if ready_since is None:
                # noted while it loads too: a server that dies loading (its model processes with it)
                # leaves its regions, and nobody could find them after
                if now >= next_scan:
                    commands = _group_commands(self.proc.pid)
                    self._note_regions(commands)
                    if self.python_env is None:
                        self._note_python_env(commands)
                    next_scan = now + 1.0
                if self.ready():
                    ready_since, self.was_ready = now, True
                    if self.python_env is None:
                        self._note_python_env(_group_commands(self.proc.pid))
                    log(f"tritonserver ready after {now - self.started:.1f} s")
                elif now - self.started > o.start_timeout:
                    return f"not ready after {o.start_timeout:.0f} s"
                self._sleep(0.5)
                continue
            dead = self._dead_model()
            if dead:
                return dead
            if o.probe_interval <= 0 or now < next_probe:
                self._sleep(0.5)
                continue
            result = self._probe()
            if result is None:
                break
            status, what = result
            next_probe = time.monotonic() + o.probe_interval
            self._note_regions(_group_commands(self.proc.pid))  # a model loaded since
            if status == probe.HEALTHY:
                failures, self.was_healthy = 0, True
            elif status == DEAD_MODEL:
                return what
            elif status == probe.BROKEN:
                return f"probe: {what}"
            else:
                failures += 1
                log(f"probe failed ({failures}/{o.probe_failures}): {what}")
                if failures >= o.probe_failures:
                    return f"probe failed {failures} times: {what}"
        return "asked to stop"

    def _dead_model(self) -> str | None:
        """Why the server must be restarted now, from its model processes' beacons: one has died, stopped
        answering, or reports it cannot serve. Nothing inside Triton 2.51 can end the requests a dead
        orchestrator process held (their streams would wait for good), and nothing brings the process
        back; a restart does both, without waiting for a probe (or with probes off)."""
        if not self.run_dir:
            return None
        if not os.path.isdir(self.run_dir):  # (a /tmp cleaner?) its sockets, key and beacons are gone with it
            return f"model process: the server's runtime directory {self.run_dir} is gone"
        fault = liveness.beacon_fault(directory=self.run_dir)
        if fault is None or fault[0] == "unreadable":
            self.stale_since = None
            return None
        kind, why = fault
        if kind == "stale":  # beacons carry wall-clock times: a clock step makes them look stale once
            now = time.monotonic()
            self.stale_since = self.stale_since or now
            if now - self.stale_since < STALE_CONFIRM_S:
                return None
            if not self._health("live"):  # a process waiting on the server's IPC stops its beacon too
                return f"tritonserver is not answering, nor its model processes that wait on it: {why}"
        return f"model process: {why}"

    def _probe(self):
        """probe.probe in a daemon thread, so that a signal is not kept waiting for it; None if stopping.
        A model process found dead meanwhile ends the wait: (DEAD_MODEL, why); the probe's thread is
        then left to end with its server (stop() waits for it)."""
        out: list = []
        t = threading.Thread(target=lambda: out.append(probe.probe(self.url, self.opts.probe_timeout,
                                                                    metrics_url=self.metrics_url)), daemon=True)
        self.probe_thread = t
        t.start()
        next_check = time.monotonic() + 0.5
        while t.is_alive() and not self.stopping:
            t.join(0.1)
            self._tend()
            if time.monotonic() >= next_check:
                dead = self._dead_model()
                if dead:
                    return DEAD_MODEL, dead
                next_check = time.monotonic() + 0.5
        return out[0] if out else None

    def _sleep(self, seconds: float):
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(max(0.0, min(0.1, end - time.monotonic())))
            self._tend()

    def _tend(self):
        """Start or restart the companions, from the first server's start on: while another process
        holds the server's ports (a second copy of the service, say) nothing is started."""
        if self.stopping or not self.started_once:
            return
        for c in self.companions:
            c.tend()
            if self.opts.max_failed_starts and c.failures >= self.opts.max_failed_starts:
                self.fatal = (f"{c.name} exited {c.failures} times in a row within a minute of its start "
                              f"(last exit code {c.last_code})")
                self.stopping = True

    def _on_signal(self, signum, _frame):
        self.stopping = True


def _companion_grace() -> str:
    """The OpenAI gateway's drain after SIGTERM (its --shutdown-timeout, from the environment both
    share) plus 5 s; a value the gateway would refuse is left to it to say so."""
    try:
        drain = float(os.environ.get("VOXCPM_OPENAI_SHUTDOWN_TIMEOUT", "20"))
    except ValueError:
        return "25"
    return f"{drain + 5:g}" if drain > 0 else "25"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    i = argv.index("--") if "--" in argv else len(argv)
    # --print-restricted (serve.sh without supervision) takes none of the supervision's settings
    env = (lambda _var, default: default) if "--print-restricted" in argv[:i] else os.environ.get

    def number(kind, var: str):
        """argparse's type for an option whose default is environment variable `var`: its error names it."""
        def convert(text: str):
            try:
                return kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not {'a whole number' if kind is int else 'a number'}: {text!r} "
                                                 f"(given, or from {var})") from None
        return convert

    ap = argparse.ArgumentParser(usage="%(prog)s [options] -- tritonserver ARGS...",
                                 description="Run tritonserver and restart it when it breaks.")
    # string defaults: argparse converts them, so a bad value in the environment is a usage error too
    ap.add_argument("--probe-interval", type=number(float, "VOXCPM_PROBE_INTERVAL"), default=env("VOXCPM_PROBE_INTERVAL", "10"),
                    help="seconds between liveness probes once ready; 0: no probes, restart only on exit "
                         "or on a model process's beacon (env VOXCPM_PROBE_INTERVAL)")
    ap.add_argument("--probe-timeout", type=number(float, "VOXCPM_PROBE_TIMEOUT"), default=env("VOXCPM_PROBE_TIMEOUT", "60"),
                    help="env VOXCPM_PROBE_TIMEOUT")
    ap.add_argument("--probe-failures", type=number(int, "VOXCPM_PROBE_FAILURES"), default=env("VOXCPM_PROBE_FAILURES", "3"),
                    help="consecutive failed probes before a restart (a dead model process restarts at once; "
                         "env VOXCPM_PROBE_FAILURES)")
    ap.add_argument("--start-timeout", type=number(float, "VOXCPM_START_TIMEOUT"), default=env("VOXCPM_START_TIMEOUT", "900"),
                    help="seconds a start may take to become ready, and ports held by another process may "
                         "keep it waiting (env VOXCPM_START_TIMEOUT)")
    ap.add_argument("--max-failed-starts", type=number(int, "VOXCPM_MAX_FAILED_STARTS"), default=env("VOXCPM_MAX_FAILED_STARTS", "5"),
                    help="starts in a row that do not serve (never ready, or never pass a probe), or quick exits "
                         "in a row of a companion, before giving up (exit 1); 0: never give up "
                         "(env VOXCPM_MAX_FAILED_STARTS)")
    ap.add_argument("--companion", action="append", default=[], metavar="CMD",
                    help="a command line (shell-quoted) to run beside the server and restart when it exits")
    ap.add_argument("--companion-port", action="append", default=[], metavar="HOST:PORT",
                    help="a port a companion listens on: no start while another process holds it")
    ap.add_argument("--companion-grace", type=number(float, "VOXCPM_COMPANION_GRACE"), default=env("VOXCPM_COMPANION_GRACE", _companion_grace()),
                    help="seconds a stopping companion gets between SIGTERM and SIGKILL, for its requests in flight "
                         "(env VOXCPM_COMPANION_GRACE; default: the gateway's drain, VOXCPM_OPENAI_SHUTDOWN_TIMEOUT "
                         "(20 s), plus 5 s)")
    ap.add_argument("--print-restricted", action="store_true",
                    help="only print the server command with the restricted-API flags, an argument a line "
                         "(scripts/serve.sh runs it so without supervision)")
    opts = ap.parse_args(argv[:i])  # --help stops here
    if i == len(argv):
        ap.error("no server command: give it after --")
    for flag, value, least in (("--probe-timeout", opts.probe_timeout, None),
                               ("--start-timeout", opts.start_timeout, None),
                               ("--companion-grace", opts.companion_grace, None),
                               ("--probe-interval", opts.probe_interval, 0.0)):
        if not math.isfinite(value) or not (value > 0 if least is None else value >= least):
            ap.error(f"{flag} must be a {'positive' if least is None else 'non-negative'} number of seconds, "
                     f"got {value:g} (or its VOXCPM_ variable)")
    for text in opts.companion_port:
        try:
            _host_port(text)
        except ValueError as e:
            ap.error(f"--companion-port: {e}")
    if opts.probe_failures < 1:
        ap.error(f"--probe-failures must be 1 or more, got {opts.probe_failures}")
    if opts.max_failed_starts < 0:
        ap.error(f"--max-failed-starts must be 0 or more, got {opts.max_failed_starts}")
    if not argv[i + 1:]:
        ap.error("no server command after --")
    server = argv[i + 1:]
    exit_timeout = _arg(server, "exit-timeout-secs", "30")
    if not (exit_timeout.isascii() and exit_timeout.isdigit() and int(exit_timeout) <= 2**31 - 1):
        # what the supervisor reads of the server's own arguments; tritonserver's is a 32-bit integer
        ap.error(f"tritonserver --exit-timeout-secs must be a whole number of seconds (0-2147483647), "
                 f"got {exit_timeout!r}")
    for name in ("http", "grpc", "metrics"):
        port = _arg(server, f"{name}-port", "0")
        if not port.isdigit() or int(port) > 65535:
            ap.error(f"tritonserver --{name}-port must be a port number (0-65535), got {port!r}")
    if opts.print_restricted:
        print("\n".join(restricted(argv[i + 1:])))
        return 0
    return Supervisor(argv[i + 1:], opts).run()


if __name__ == "__main__":
    sys.exit(main())
