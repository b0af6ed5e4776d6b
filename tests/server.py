"""Start a real ``tritonserver`` for tests, and stop it cleanly.

The environment comes from ``scripts/triton_env.sh`` (the same file
``scripts/serve.sh`` sources), so tests and the served product run the same way.

    from tests.server import TritonServer

    with TritonServer("tests/fixtures/echo_repo", env={"FOO": "1"}) as srv:
        client = tritonclient.http.InferenceServerClient(srv.http_url)
        ...
    # on exit: SIGTERM, wait, check that no stub process is left; srv.log holds
    # the server's whole log.

As pytest fixtures (import them into the test module or a conftest.py)::

    from tests.server import triton_server_factory  # noqa: F401

    @pytest.fixture(scope="module")
    def server(triton_server_factory):
        return triton_server_factory("model_repository", env={...})

The factory fixture is module-scoped: servers started with it stop at the end
of the test module, and their log tail is printed (pytest shows it for failing
tests, or always with ``-s``).
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, Mapping

import pytest

REPO = Path(__file__).resolve().parents[1]
TRITON_ENV_SH = REPO / "scripts" / "triton_env.sh"
# The logs servers made for themselves (no log_path given): tests/conftest.py removes them when a test
# session passes (a failure's message carries the tail of the log it needs).
OWN_LOGS: list[Path] = []

# The python backend's directory, one per server (mkdtemp under /tmp, not $TMPDIR); a clean exit removes it.
PYTHON_ENV_GLOB = "/tmp/python_env_*"

_env_cache: dict[str, dict[str, str]] = {}


def venv_dir() -> str:
    """$VENV, else the venv running this Python, else $REPO/.venv."""
    if os.environ.get("VENV"):
        return os.environ["VENV"]
    if sys.prefix != sys.base_prefix:
        return sys.prefix
    return str(REPO / ".venv")


def triton_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver (and its stubs, and perf_analyzer) need.

    ``base`` (default ``os.environ``) overlaid with what ``scripts/triton_env.sh``
    exports: PATH (venv bin first), LD_LIBRARY_PATH (nvidia_pytriton.libs,
    nvidia/cuda_runtime/lib), PYTHONPATH (python_backend), TRITONSERVER_BIN,
    TRITON_BACKEND_DIR, PERF_ANALYZER_BIN, VENV, ...
    """
    base = dict(os.environ if base is None else base)
    base.setdefault("VENV", venv_dir())
    key = "\0".join(f"{k}={base.get(k, '')}" for k in ("VENV", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "TRITON_BACKEND_DIR"))
    if key not in _env_cache:
        out = subprocess.run(
            ["bash", str(TRITON_ENV_SH)], env=base, check=False, capture_output=True, text=True
        )
        if out.returncode != 0:
            raise RuntimeError(f"scripts/triton_env.sh failed ({out.returncode}): {out.stderr.strip()}")
        _env_cache[key] = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    base.update(_env_cache[key])
    return base


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _pids_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces/parens
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(d.name))
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _handles(pid: int, sig: int) -> bool:
    """Whether process `pid` catches signal `sig` (its SigCgt mask in /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the server if the test process dies first."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class TritonServerError(RuntimeError):
    pass


class TritonServer:
    """One tritonserver process on free loopback ports.

    Args:
        model_repository: path (relative paths are from the repo root).
        env: extra environment for the server and its python stubs.
        args: extra tritonserver arguments (e.g. ``["--model-control-mode=explicit",
            "--load-model=tts"]``).
        startup_timeout: seconds to wait for ``/v2/health/ready``.
        log_path: where the server's stdout+stderr go (default: a temp file).
        log_verbose: ``--log-verbose`` level.

    Attributes after ``start()``: ``http_port``, ``grpc_port``, ``metrics_port``,
    ``http_url`` ("127.0.0.1:PORT", what tritonclient.http wants),
    ``grpc_url``, ``metrics_url`` ("http://127.0.0.1:PORT/metrics"), ``proc``,
    ``pid``, ``env``, ``log_path``; ``log`` (property) is the log text so far.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike,
        *,
        env: Mapping[str, str] | None = None,
        args: Iterable[str] = (),
        startup_timeout: float = 180.0,
        log_path: str | os.PathLike | None = None,
        log_verbose: int = 0,
        exit_timeout: int = 30,
    ):
        repo = Path(model_repository)
        self.model_repository = repo if repo.is_absolute() else (REPO / repo)
        self.extra_env = dict(env or {})
        self.extra_args = list(args)
        self.startup_timeout = startup_timeout
        self.log_verbose = log_verbose
        self.exit_timeout = exit_timeout
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.leftover_processes: list[str] = []
        self.env: dict[str, str] = {}
        self.python_env: str | None = None  # the python backend's directory this server made, once ready

    # -- urls ------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-n:])

    # -- lifecycle -------------------------------------------------------------
    def command(self) -> list[str]:
        e = self.env
        return [
            e["TRITONSERVER_BIN"],
            f"--model-repository={self.model_repository}",
            f"--backend-directory={e['TRITON_BACKEND_DIR']}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            f"--log-verbose={self.log_verbose}",
            f"--exit-timeout-secs={self.exit_timeout}",
            *self.extra_args,
        ]

    def start(self) -> "TritonServer":
        if self.proc is not None:
            raise TritonServerError("already started")
        self.env = triton_env()
        # What scripts/supervise.py gives a server: its own runtime directory and internal key
        # (tests that call internal models directly stamp their requests with `internal_key`).
        self.run_dir = tempfile.mkdtemp(prefix="voxcpm-test-run-")
        # and a voices directory of its own, not the user's
        self.env.update(VOXCPM_RUN_DIR=self.run_dir, VOXCPM_INTERNAL_KEY=secrets.token_hex(16),
                        VOXCPM_VOICES_DIR=os.path.join(self.run_dir, "voices"))
        self.env.update(self.extra_env)
        self.internal_key = self.env["VOXCPM_INTERNAL_KEY"]
        if not Path(self.env["TRITON_BACKEND_DIR"], "python", "triton_python_backend_stub").exists():
            raise TritonServerError(
                f"no python backend dir at {self.env['TRITON_BACKEND_DIR']}: run scripts/setup.sh"
            )
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            OWN_LOGS.append(self.log_path)
        for attempt in range(3):  # ports may be taken between picking and binding
            self.http_port, self.grpc_port, self.metrics_port = _free_ports(3)
            self._envs_before, self.python_env = set(glob.glob(PYTHON_ENV_GLOB)), None
            with open(self.log_path, "ab") as log:
                log.write(f"### {' '.join(self.command())}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    self.command(),
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stubs are found and reaped by it
                    preexec_fn=_die_with_parent,
                    cwd=str(REPO),
                )
            try:
                self._wait_ready()
                return self
            except TritonServerError:
                port_clash = "address already in use" in self.log.lower() or "failed to start" in self.log.lower()
                self._terminate(timeout=10)
                if not port_clash or attempt == 2:
                    raise
                self.proc = None
        raise AssertionError("unreachable")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise TritonServerError(
                    f"tritonserver exited with {rc} before it was ready; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                # Triton starts its metrics endpoint after the HTTP one: a test that reads metrics
                # right after "ready" could otherwise find its port closed.
                with urllib.request.urlopen(url, timeout=2) as r, \
                        urllib.request.urlopen(self.metrics_url, timeout=2) as m:
                    if r.status == 200 and m.status == 200:
                        # The one new directory, if one is, and this server has model processes (without, the
                        # new one is another server's: Triton aborts at its exit if it finds it gone).
                        made = set(glob.glob(PYTHON_ENV_GLOB)) - self._envs_before
                        self.python_env = made.pop() if len(made) == 1 and self.stub_pids() else None
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.25)
        raise TritonServerError(
            f"tritonserver not ready after {self.startup_timeout:.0f} s; log {self.log_path}:\n{self.log_tail()}"
        )

    def is_ready(self, model: str | None = None) -> bool:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stub_pids(self) -> list[int]:
        """Live python backend stub processes started by this server."""
        if self.proc is None:
            return []
        return [p for p in _pids_in_group(self.proc.pid) if "triton_python_backend_stub" in _cmdline(p)]

    def _terminate(self, timeout: float) -> int:
        """SIGTERM, wait; SIGKILL the whole group if it does not end in time."""
        assert self.proc is not None
        pgid = self.proc.pid
        # shared-memory regions of the stubs (argv[2]); a clean exit removes them
        regions = [
            a for p in _pids_in_group(pgid) for a in _cmdline(p).split() if a.startswith("triton_python_backend_shm_region_")
        ]
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                # Before Triton's exit timeout runs out (it then exits 1), the stacks of the stubs
                # still alive go to the log: what holds the stop up.
                slow = max(1.0, min(timeout, self.exit_timeout * 0.75))
                try:
                    self.proc.wait(timeout=slow)
                except subprocess.TimeoutExpired:
                    self._dump_stub_stacks(f"still running {slow:.0f} s after SIGTERM")
                    self.proc.wait(timeout=max(1.0, timeout - slow))
            except subprocess.TimeoutExpired:
                with open(self.log_path, "a") as log:
                    log.write(f"### tests/server.py: no exit {timeout:.0f} s after SIGTERM; SIGKILL\n")
                os.killpg(pgid, signal.SIGKILL)
                killed = True
                self.proc.wait(timeout=30)
        # Stubs exit by themselves when the server unloads the models; give
        # them a moment, then record (and kill) any that did not.
        deadline = time.monotonic() + 10
        left = _pids_in_group(pgid)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _pids_in_group(pgid)
        self.leftover_processes = [f"{p} {_cmdline(p)}" for p in left]
        if left:
            with open(self.log_path, "a") as log:
                log.write(f"### tests/server.py: processes left after the server exited: {self.leftover_processes}\n")
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed = True
            except ProcessLookupError:
                pass
        if killed:
            time.sleep(0.2)
            remove_shm_regions(regions)
        self.returncode = self.proc.returncode
        shutil.rmtree(getattr(self, "run_dir", ""), ignore_errors=True)
        if self.python_env:  # a killed server, or one out of its exit timeout, leaves it (empty)
            try:
                os.rmdir(self.python_env)
            except OSError:
                pass  # gone with a clean exit, or not empty: not ours to clear
        return self.returncode

    def _dump_stub_stacks(self, why: str) -> None:
        """SIGUSR2 to each live stub that handles it (runtime.model_process registers faulthandler
        there): every thread's Python stack goes to the server's log. A stub that does not handle
        it is left alone: SIGUSR2's default action ends the process."""
        stubs = [p for p in self.stub_pids() if _handles(p, signal.SIGUSR2)]
        with open(self.log_path, "a") as log:
            log.write(f"### tests/server.py: {why}; stacks of stubs {stubs}:\n")
        for pid in stubs:  # one at a time: stubs writing at once interleave their lines in the log
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
            time.sleep(0.25)
        time.sleep(0.75)

    def stop(self, timeout: float = 60.0) -> int:
        """Stop with SIGTERM (as ``docker stop`` / Ctrl-C would); return the exit code.

        Afterwards ``leftover_processes`` lists any process of the server's
        group still alive 10 s after it exited (they are then killed).
        """
        if self.proc is None:
            return self.returncode if self.returncode is not None else 0
        if self.returncode is None:
            self._terminate(timeout)
        return self.returncode

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # last resort: never leave a server behind
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(scope="module")
def triton_server_factory():
    """``factory(model_repository, **TritonServer kwargs) -> started TritonServer``.

    All servers it started stop at the end of the module; their log tails are
    printed then.
    """
    servers: list[TritonServer] = []

    def factory(model_repository, **kwargs) -> TritonServer:
        srv = TritonServer(model_repository, **kwargs)
        servers.append(srv)
        return srv.start()

    yield factory
    for srv in servers:
        srv.stop()
        print(f"\n--- tritonserver log ({srv.log_path}), last lines ---\n{srv.log_tail(40)}")
        if srv.leftover_processes:
            print(f"--- processes left after stop: {srv.leftover_processes}")


def remove_shm_regions(names):
    """Unlink these shared-memory regions (a killed process removes none of its own)."""
    for r in names:
        try:
            os.unlink(f"/dev/shm/{r}")
        except OSError:
            pass


def edited_repository(dst: str | os.PathLike, parameters: Mapping[str, Mapping[str, str]] = {},
                      instances: Mapping[str, int] = {}) -> Path:
    """A copy of the project's model_repository in `dst` with some model parameters and instance
    counts changed: ``parameters={"decoder": {"max_num_seqs": "1"}}, instances={"tts_stream": 1}``.
    Unchecked, unlike scripts/repository_copy.py: tests give bad values on purpose. The models find
    python_backend through VOXCPM_PYTHON_BACKEND (set by triton_env)."""
    import re

    from voxcpm_triton.serving.parameters import with_parameters

    dst = Path(dst)
    shutil.copytree(REPO / "model_repository", dst, ignore=shutil.ignore_patterns("__pycache__"))
    for model in set(parameters) | set(instances):
        cfg = dst / model / "config.pbtxt"
        text = with_parameters(cfg.read_text(), parameters.get(model, {}))
        if model in instances:
            text, n = re.subn(r"count: \d+", f"count: {instances[model]}", text)
            assert n == 1, cfg
        cfg.write_text(text)
    return dst
