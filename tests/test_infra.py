"""Serving infrastructure, proven on a throwaway echo model repository.

A real tritonserver (nvidia-pytriton 2.51 binary, python backend) is started by
tests/server.py with the environment of scripts/triton_env.sh; scripts/serve.sh
is exercised too. The models live in tests/fixtures/echo_repo (and exit_repo).
"""

from __future__ import annotations

import ast
import atexit
import importlib.metadata
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require_executable
from tests.server import (REPO, TritonServer, _children, _cmdline, _free_ports, _pids_in_group, edited_repository,
                          triton_env)
from tests.server import triton_server_factory  # noqa: F401  (fixture)

ECHO_REPO = REPO / "tests" / "fixtures" / "echo_repo"
EXIT_REPO = REPO / "tests" / "fixtures" / "exit_repo"


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("echo_markers")


@pytest.fixture(scope="module")
def server(triton_server_factory, marker_dir):  # noqa: F811
    return triton_server_factory(ECHO_REPO, env={"ECHO_MARKER_DIR": str(marker_dir)})


# --- HTTP ----------------------------------------------------------------------


def test_http_infer_echo(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo") and client.is_model_ready("echo_stream")
    x = np.arange(7, dtype=np.float32) * 0.5
    inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = client.infer("echo", [inp])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT"), x)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_client_cli_at_the_other_protocols_port_says_which_port(server, protocol):
    """On Triton's own ports (a stand-in answered gRPC's preface; Triton's HTTP port closes the socket,
    and the hint was missing): gRPC aimed at the HTTP port and HTTP at the gRPC port each say which
    port to use, in one line."""
    url = server.http_url if protocol == "grpc" else server.grpc_url
    p = subprocess.run([sys.executable, "-m", "voxcpm_client", "voices", "list", "--protocol", protocol, "--url", url,
                        "--timeout", "20"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "client")))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert lines[0].endswith("if that is Triton's HTTP port, use its gRPC port (default 8001) or the HTTP protocol"
                             if protocol == "grpc" else
                             "if that is Triton's gRPC port, use its HTTP port (default 8000) or the gRPC protocol"), lines


def test_stub_sees_the_venv(server):
    """The python stub runs with the project venv: torch imports, sys.prefix is
    $VENV, and $VOXCPM_PYTHON_BACKEND points at python_backend/."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, np.float32))
    res = client.infer("echo", [inp])
    torch_version = res.as_numpy("TORCH_VERSION")[0].decode()
    assert torch_version == importlib.metadata.version("torch")
    prefix = res.as_numpy("SYS_PREFIX")[0].decode()
    assert os.path.realpath(prefix) == os.path.realpath(server.env["VENV"])
    # The stub's embedded Python ignores PYTHONPATH (sys.path has no trace of it);
    # model.py files put $VOXCPM_PYTHON_BACKEND on sys.path, and that variable
    # (like any other in the server's environment) does reach the stub.
    assert res.as_numpy("PYTHON_BACKEND")[0].decode() == str(REPO / "python_backend")
    sys_path = res.as_numpy("SYS_PATH")[0].decode().split(os.pathsep)
    assert str(ECHO_REPO / "echo" / "1") in sys_path, sys_path


def test_http_bad_request_is_an_error_not_a_crash(server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("WRONG", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("echo", [inp])
    assert client.is_model_ready("echo")


def test_http_generate_stream_decoupled(server):
    """HTTP generate_stream (server-sent events) on the decoupled model."""
    body = json.dumps({"COUNT": 3}).encode()
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/echo_stream/generate_stream",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    events = [json.loads(line[len("data:"):]) for line in text.splitlines() if line.startswith("data:")]
    # one-element outputs come back as scalars in the JSON of generate_stream
    assert [e["INDEX"] for e in events] == [0, 1, 2], text
    assert events[2]["DATA"] == [2.0, 2.0, 2.0], text


# --- gRPC streaming ----------------------------------------------------------------


def _stream(server, requests, timeout=30.0):
    """Send (request_id, count, delay_ms) on one gRPC stream; collect per request id
    the list of (index, data) and whether a final flag arrived, or the error."""
    import tritonclient.grpc as grpcclient

    q: queue.Queue = queue.Queue()

    def callback(q, result, error):
        q.put((result, error))

    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: dict[str, dict] = {rid: {"items": [], "final": False, "error": None} for rid, _, _ in requests}
    client.start_stream(callback=partial(callback, q))
    try:
        for rid, count, delay in requests:
            c = grpcclient.InferInput("COUNT", [1], "INT32")
            c.set_data_from_numpy(np.array([count], np.int32))
            inputs = [c]
            if delay:
                d = grpcclient.InferInput("DELAY_MS", [1], "INT32")
                d.set_data_from_numpy(np.array([delay], np.int32))
                inputs.append(d)
            client.async_stream_infer("echo_stream", inputs, request_id=rid, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout
        while not all(g["final"] or g["error"] for g in got.values()):
            result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                # errors carry no request id here; attribute to the one not done
                pending = [g for g in got.values() if not (g["final"] or g["error"])]
                pending[0]["error"] = error
                continue
            resp = result.get_response()
            g = got[resp.id]
            final = resp.parameters.get("triton_final_response")
            index = result.as_numpy("INDEX")
            if index is not None:
                g["items"].append((int(index[0]), result.as_numpy("DATA")))
            if final is not None and final.bool_param:
                g["final"] = True
    finally:
        client.stop_stream()
        client.close()
    return got


def test_grpc_stream_n_responses_then_final(server):
    n = 5
    got = _stream(server, [("a", n, 0)])["a"]
    assert got["error"] is None
    assert got["final"]
    assert [i for i, _ in got["items"]] == list(range(n))
    for i, data in got["items"]:
        np.testing.assert_array_equal(data, np.full(i + 1, i, np.float32))


def test_grpc_stream_interleaved_requests_and_empty(server):
    got = _stream(server, [("x", 3, 5), ("y", 0, 0), ("z", 4, 0)])
    assert [i for i, _ in got["x"]["items"]] == [0, 1, 2]
    assert got["y"]["items"] == [] and got["y"]["final"]
    assert [i for i, _ in got["z"]["items"]] == [0, 1, 2, 3]
    assert all(g["final"] and g["error"] is None for g in got.values())


def test_grpc_stream_error_reported(server):
    got = _stream(server, [("bad", -1, 0)])["bad"]
    assert got["error"] is not None and "COUNT must be >= 0" in str(got["error"])
    # the model keeps serving
    assert [i for i, _ in _stream(server, [("ok", 2, 0)])["ok"]["items"]] == [0, 1]


# --- perf_analyzer, metrics --------------------------------------------------------------


def test_perf_analyzer_http(server):
    pa = server.env["PERF_ANALYZER_BIN"]
    assert os.access(pa, os.X_OK), pa
    cmd = [
        pa, "-m", "echo", "-u", server.http_url, "-i", "http",
        "--shape", "INPUT:16", "--concurrency-range", "2",
        # A fixed count, not windows until stable: a busy CI runner's windows need not agree.
        "--request-count", "400",
    ]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=server.env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"Throughput: ([\d.]+) infer/sec", out)
    assert m and float(m.group(1)) > 0, out
    sent = int(re.search(r"Request count: (\d+)", out).group(1))
    ok = int(re.search(r"Successful request count: (\d+)", out).group(1))
    # Server-side and client-side windows differ by a few requests either way; failures would
    # show as "error" below and in test_metrics_endpoint's failure counters.
    assert sent > 0 and ok >= 0.98 * sent, out
    assert "error" not in out.lower(), out
    print(f"perf_analyzer: {m.group(1)} infer/s, {sent} requests in {time.monotonic() - t0:.1f} s")


def test_metrics_endpoint(server):
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    ok = re.search(r'^nv_inference_request_success\{model="echo",version="1"\} (\d+)$', text, re.M)
    assert ok and int(ok.group(1)) > 0, text[:2000]
    fails = re.findall(r'^nv_inference_request_failure\{model="echo",reason="(\w+)",version="1"\} (\d+)$', text, re.M)
    assert fails and all(int(n) == 0 for _, n in fails), fails


# --- lifecycle: scripts/serve.sh, SIGTERM -------------------------------------------------


def _status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _group_left(pgid: int, seconds: float = 10) -> list[int]:
    """The group's processes still there after up to `seconds` (those ending take a moment)."""
    deadline = time.monotonic() + seconds
    while _pids_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _pids_in_group(pgid)


def test_serve_sh_keeps_http_on_the_loopback_unless_told():
    """TRITON_BIND opens gRPC and metrics; HTTP (Triton's HTTP frontend is for trusted clients) needs
    TRITON_HTTP_BIND too. Ports and addresses as extra arguments are refused: the gateway and the
    supervisor would not see them."""
    env = triton_env()
    env.pop("TRITON_HTTP_BIND", None)
    env.update(SKIP_SETUP="1", TRITON_BIND="0.0.0.0")

    def serve(*args):
        return subprocess.run(["bash", str(REPO / "scripts" / "serve.sh"), "--print-cmd", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    out = serve()
    assert out.returncode == 0, out.stderr
    addresses = [a for a in shlex.split(out.stdout) if "-address=" in a]
    assert addresses == ["--http-address=127.0.0.1", "--grpc-address=0.0.0.0", "--metrics-address=0.0.0.0"]
    env["TRITON_HTTP_BIND"] = "0.0.0.0"
    assert "--http-address=0.0.0.0" in shlex.split(serve().stdout)
    for arg in ("--grpc-port=9001", "--http-address=0.0.0.0"):
        out = serve(arg)
        assert out.returncode == 2 and out.stderr.startswith(f"[serve] {arg}: set TRITON_HTTP_PORT"), out.stderr
    assert serve("--log-verbose=1").returncode == 0
    # IPv6, bracketed or not: tritonserver's gRPC takes it in brackets, its HTTP and metrics as ipv6:ADDRESS
    for v6 in ("::1", "[::1]"):
        out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh"), "--print-cmd"], capture_output=True,
                             env={**env, "TRITON_BIND": v6, "TRITON_HTTP_BIND": v6}, text=True, timeout=60)
        addresses = [a for a in shlex.split(out.stdout) if "-address=" in a]
        assert addresses == ["--http-address=ipv6:::1", "--grpc-address=[::1]", "--metrics-address=ipv6:::1"], out
    # a mode after other arguments went to tritonserver as an argument, which refused it, five starts in a row
    # (a blank VOXCPM_CHECKPOINT is unset, as the models read it: serve.sh makes the embedded default first)
    out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh"), "--log-verbose=1", "--print-cmd"],
                         env={**env, "VOXCPM_CHECKPOINT": " "}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "[serve] --print-cmd goes first: scripts/serve.sh --print-cmd" in out.stderr, out
    assert "[serve] checkpoint: " in out.stderr, out.stderr


def test_serve_sh_names_its_port_variables_when_a_port_is_held(tmp_path):
    """A port another process holds keeps the supervisor waiting: the wait names where serve.sh takes
    its ports from (a newcomer's server collided with one already running on 8000)."""
    import socket

    from tests.server import free_port

    env = {**triton_env(), "SKIP_SETUP": "1", "VOXCPM_START_TIMEOUT": "2", "TMPDIR": str(tmp_path),
           "TRITON_GRPC_PORT": str(free_port()), "TRITON_METRICS_PORT": str(free_port()), "OPENAI_API_PORT": "0"}
    env.pop("TRITON_HTTP_BIND", None)
    env.pop("TRITON_BIND", None)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        env["TRITON_HTTP_PORT"] = str(other.getsockname()[1])
        out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh")], env=env, capture_output=True, text=True,
                             timeout=120)
    hint = "scripts/serve.sh takes its ports from TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT"
    assert out.returncode == 1, out.stderr
    assert f"http 127.0.0.1:{env['TRITON_HTTP_PORT']} (checking every 2-2.5 s; {hint})" in out.stderr, out.stderr
    assert re.search(rf"giving up: port in use by another process: .*, for \d+ s; {hint}\n", out.stderr), out.stderr


def test_serve_sh_help_and_a_checkpoint_that_is_not_one_stop_before_anything_starts(tmp_path):
    """--help prints the header's usage and variables (it used to reach tritonserver, which the
    supervisor then restarted five times); a VOXCPM_CHECKPOINT without config.json, without one of
    its files or with a config.json the models refuse is refused at once, naming it, instead of
    every model failing on it five starts in a row; so are a VOXCPM_DTYPE, VOXCPM_DEVICE or VOXCPM_LORA_DIR
    the models refuse, a config.pbtxt value they refuse, a gateway setting it refuses, and ports that are not ports. The supervisor's
    --help lists its options without a server command."""
    env = triton_env()
    env.pop("SKIP_SETUP", None)  # --help must not run setup either
    out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh"), "--help"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("Run Triton Inference Server"), out
    assert "VOXCPM_VOICES_DIR" in out.stdout and "SKIP_SETUP=1" in out.stdout and "set -euo" not in out.stdout
    assert "[setup" not in out.stderr, out.stderr
    env.update(SKIP_SETUP="1", VOXCPM_CHECKPOINT=str(tmp_path))
    out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"[serve] VOXCPM_CHECKPOINT={tmp_path} is not a VoxCPM2 checkpoint directory (no config.json)"), out
    # a config.json the models would refuse, or a file missing: said once, as each model would say it
    (tmp_path / "config.json").write_text("{}")
    out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"[serve] VOXCPM_CHECKPOINT={tmp_path} cannot be served: {tmp_path}: no model weights file (expected one "
        "of model.safetensors, pytorch_model.bin)"), out
    for name in ("model.safetensors", "audiovae.pth", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes(b"")
    out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"[serve] VOXCPM_CHECKPOINT={tmp_path} cannot be served: config.json: lm_config: missing required field"), out
    # settings every start would fail on the same way: said once, before any start
    env.pop("VOXCPM_CHECKPOINT")
    spaced = tmp_path / "model repository"
    shutil.copytree(REPO / "model_repository", spaced)
    quoted = tmp_path / "the_model's_repository"
    shutil.copytree(REPO / "model_repository", quoted)
    plain = tmp_path / "repo#1~{a}!"
    shutil.copytree(REPO / "model_repository", plain)
    edited = edited_repository(tmp_path / "edited", parameters={"decoder": {"lora_dir": str(tmp_path / "none")}})
    for bad, said in [({"MODEL_REPOSITORY": str(tmp_path / "none")}, f"MODEL_REPOSITORY={tmp_path / 'none'} is not a "
                                                                        "directory"),
                      ({"TRITON_LOG_VERBOSE": "abc"}, "TRITON_LOG_VERBOSE=abc is not a whole number"),
                      ({"TRITON_HTTP_PORT": "abc"}, "TRITON_HTTP_PORT=abc is not a port number (1-65535)"),
                      ({"OPENAI_API_PORT": "70000"}, "OPENAI_API_PORT=70000 is not a port number (1-65535, or 0: "
                                                     "no gateway)"),
                      ({"TRITON_GRPC_PORT": "08001"}, "TRITON_GRPC_PORT=08001 is not a port number (1-65535)"),
                      # 0: a port the system picks, which neither the supervisor nor the gateway can find
                      ({"TRITON_HTTP_PORT": "0"}, "TRITON_HTTP_PORT=0 is not a port number (1-65535)"),
                      ({"TRITON_EXIT_TIMEOUT": " 30"}, "TRITON_EXIT_TIMEOUT= 30 is not a whole number of seconds"),
                      # tritonserver's 32-bit integers: it refused to start, five times
                      ({"TRITON_EXIT_TIMEOUT": "2147483648"}, "TRITON_EXIT_TIMEOUT=2147483648 is not a whole number "
                                                              "of seconds (0-2147483647)"),
                      ({"TRITON_LOG_VERBOSE": "99999999999"}, "TRITON_LOG_VERBOSE=99999999999 is not a whole number "
                                                              "(0-2147483647)"),
                      # the Python backend's unquoted bash command line: no model process would start
                      ({"MODEL_REPOSITORY": str(spaced)}, f"MODEL_REPOSITORY={spaced} has a space or a character "
                                                          "special to the shell (' ') in it"),
                      ({"MODEL_REPOSITORY": str(quoted)}, f"MODEL_REPOSITORY={quoted} has a space or a character "
                                                          "special to the shell (''') in it"),
                      # not special inside an absolute path: only the port is said
                      ({"MODEL_REPOSITORY": str(plain), "TRITON_HTTP_PORT": "abc"}, "TRITON_HTTP_PORT=abc is not"),
                      ({"VOXCPM_CHECKPOINT": str(tmp_path / "none")}, f"VOXCPM_CHECKPOINT={tmp_path / 'none'} is not a "
                                                                        "VoxCPM2 checkpoint directory (no such directory)"),
                      ({"TRITON_HTTP_PORT": "18555", "OPENAI_API_PORT": "18555"}, "are the same port"),
                      # the models' own settings from the environment (each failed every model's load)
                      ({"VOXCPM_DTYPE": "fp64"}, "VOXCPM_DTYPE=fp64 is not a dtype: must be one of auto, float32"),
                      ({"VOXCPM_DEVICE": "cuda:99"}, "VOXCPM_DEVICE=cuda:99 cannot be used: "),
                      ({"VOXCPM_DEVICE": "meta"}, "VOXCPM_DEVICE=meta cannot be used: device 'meta': must be cpu, "
                                                  "cuda or cuda:<index> (or auto)"),
                      ({"VOXCPM_LORA_DIR": str(tmp_path / "none")}, f"VOXCPM_LORA_DIR={tmp_path / 'none'} is not a "
                                                                      "directory"),
                      # the gateway's settings (it refused them only once Triton was up, five times over)
                      ({"VOXCPM_OPENAI_STALL_TIMEOUT": "nan"}, "the OpenAI gateway's settings: argument --stall-timeout: "
                                                               "must be a number above 0 up to 10000000, got 'nan' (the flag, or "
                                                               "VOXCPM_OPENAI_STALL_TIMEOUT)"),
                      ({"VOXCPM_OPENAI_LOG_LEVEL": "loud"}, "the OpenAI gateway's settings: VOXCPM_OPENAI_LOG_LEVEL "
                                                            "must be one of"),
                      # and the models' own config.pbtxt, which the environment does not override
                      ({"MODEL_REPOSITORY": str(edited)}, f"{edited}/decoder/config.pbtxt: parameter 'lora_dir' "
                                                          f"({tmp_path / 'none'}) cannot be used: not a directory")]:
        out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh")], env={**env, **bad}, capture_output=True,
                             text=True, timeout=60)
        # one line: the setting and what is wrong with it (a leading-zero port also printed bash's own error)
        assert out.returncode == 2 and out.stderr.startswith("[serve] ") and said in out.stderr, (bad, out.stderr)
        assert out.stderr.count("\n") == 1 and "tritonserver" not in out.stderr, (bad, out.stderr)
    # without the supervisor no gateway runs, so its settings are not looked at: tritonserver itself
    # runs, and refuses the option it is given here at once
    out = subprocess.run(["bash", str(REPO / "scripts" / "serve.sh"), "--no-such-option"], capture_output=True,
                         text=True, timeout=60, env={**env, "VOXCPM_SUPERVISE": "0", "VOXCPM_OPENAI_STALL_TIMEOUT": "nan"})
    assert out.returncode == 1 and "--no-such-option" in out.stderr and "gateway" not in out.stderr, out
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "supervise.py"), "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "--probe-interval" in out.stdout and "-- tritonserver ARGS" in out.stdout, out
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "supervise.py"), "--probe-interval", "5"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "no server command" in out.stderr, out


@pytest.mark.parametrize("key", ["let-me-in", None])
def test_serve_sh_bare_closes_the_restricted_apis_too(tmp_path, key):
    """VOXCPM_SUPERVISE=0 runs tritonserver without the supervisor, which adds the restricted-API
    flags otherwise: serve.sh adds them itself (with a random key when VOXCPM_ADMIN_KEY is unset)."""
    http, grpc, metrics = _free_ports(3)
    env = triton_env()
    env.update(SKIP_SETUP="1", VOXCPM_SUPERVISE="0", MODEL_REPOSITORY=str(ECHO_REPO), TRITON_HTTP_PORT=str(http),
               TRITON_GRPC_PORT=str(grpc), TRITON_METRICS_PORT=str(metrics), ECHO_MARKER_DIR=str(tmp_path))
    env.pop("VOXCPM_ADMIN_KEY", None)
    if key is not None:
        env["VOXCPM_ADMIN_KEY"] = key
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "serve.sh")], env=env, stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if _port_open(http) and _status(base + "/v2/health/ready") == 200:
                break
            time.sleep(0.25)
        assert _status(base + "/v2/health/ready") == 200, log.read_text()
        assert Path(f"/proc/{proc.pid}/exe").resolve().name == "tritonserver"  # bare: serve.sh exec'd it
        assert _status(base + "/v2/logging") == 403
        if key is not None:
            assert _status(base + "/v2/logging", {"voxcpm-admin-key": "wrong"}) == 403
            assert _status(base + "/v2/logging", {"voxcpm-admin-key": key}) == 200
        else:
            assert "APIs closed" in log.read_text()
        assert _status(base + "/v2/models/echo/ready") == 200  # inference and health stay open
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert _group_left(proc.pid) == [], "processes left after SIGTERM"


def test_serve_sh_serves_on_ipv6(tmp_path):
    """TRITON_BIND=::1: every listener of tritonserver and the gateway on the IPv6 loopback (gRPC used to
    get `::1:PORT`, which it cannot parse: no start ever served). Then SIGTERM leaves nothing."""
    import socket

    import tritonclient.grpc as grpcclient

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    http, grpc, metrics, openai_port = _free_ports(4)
    env = triton_env()
    env.update(SKIP_SETUP="1", MODEL_REPOSITORY=str(ECHO_REPO), TRITON_BIND="::1", TRITON_HTTP_BIND="::1",
               TRITON_HTTP_PORT=str(http), TRITON_GRPC_PORT=str(grpc), TRITON_METRICS_PORT=str(metrics),
               ECHO_MARKER_DIR=str(tmp_path), VOXCPM_PROBE_INTERVAL="0", OPENAI_API_PORT=str(openai_port))
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "serve.sh")], env=env, stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if _status(f"http://[::1]:{http}/v2/health/ready") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.25)
        assert _status(f"http://[::1]:{metrics}/metrics") == 200
        assert grpcclient.InferenceServerClient(f"[::1]:{grpc}").is_model_ready("echo")
        while True:  # the gateway (it answers 503: the echo repository has no tts models)
            assert time.monotonic() < deadline, log.read_text()
            with socket.socket(socket.AF_INET6) as s:
                if s.connect_ex(("::1", openai_port)) == 0:
                    break
            time.sleep(0.25)
        assert f"OpenAI speech API on http://[::1]:{openai_port}/v1" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert _group_left(proc.pid) == [], "processes left after SIGTERM"


def test_serve_sh_supervises_restricts_and_stops_cleanly(tmp_path):
    """scripts/serve.sh runs tritonserver under scripts/supervise.py: Triton's shared-memory,
    model-repository, logging and trace APIs answer only with the admin key; SIGTERM unloads the
    models (finalize runs), everything exits 0 and no process of the server remains. The OpenAI
    gateway runs beside it on OPENAI_API_PORT, is restarted when it dies, and stops with it."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    http, grpc, metrics, openai_port = _free_ports(4)
    env = triton_env()
    env.update(
        SKIP_SETUP="1",
        MODEL_REPOSITORY=str(ECHO_REPO),
        TRITON_HTTP_PORT=str(http),
        TRITON_GRPC_PORT=str(grpc),
        TRITON_METRICS_PORT=str(metrics),
        ECHO_MARKER_DIR=str(tmp_path),
        VOXCPM_ADMIN_KEY="let-me-in",
        VOXCPM_PROBE_INTERVAL="0",  # the echo repository has no tts_stream to probe
        OPENAI_API_PORT=str(openai_port),
    )
    env.pop("VOXCPM_OPENAI_API_KEY", None)
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "serve.sh")],
            env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server_pid = None
    gateways: list[int] = []
    try:
        deadline = time.monotonic() + 120
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            ready = _status(f"http://127.0.0.1:{http}/v2/health/ready") == 200 if _port_open(http) else False
            if ready:
                break
            time.sleep(0.25)
        assert ready, log.read_text()
        (server_pid,) = [p for p in _children(proc.pid) if Path(f"/proc/{p}/exe").resolve().name == "tritonserver"]
        assert len([p for p in _pids_in_group(server_pid) if p != server_pid]) == 2  # the two stubs

        base = f"http://127.0.0.1:{http}"
        for path in ("/v2/systemsharedmemory/status", "/v2/cudasharedmemory/status", "/v2/logging", "/v2/trace/setting"):
            assert _status(base + path) == 403, path
            assert _status(base + path, {"voxcpm-admin-key": "wrong"}) == 403, path
            assert _status(base + path, {"voxcpm-admin-key": "let-me-in"}) == 200, path
        req = urllib.request.Request(base + "/v2/repository/index", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 403
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        try:
            with pytest.raises(InferenceServerException, match="(?i)restricted|permission|unavailable"):
                c.get_system_shared_memory_status()
            with pytest.raises(InferenceServerException):
                c.unload_model("echo")
            # gRPC prefixes the header name
            assert c.get_system_shared_memory_status(headers={"triton-grpc-protocol-voxcpm-admin-key": "let-me-in"}) is not None
            assert c.is_model_ready("echo")  # inference and health stay open
        finally:
            c.close()

        # the gateway: up (its /health says Triton has no tts_stream here), supervised
        gateways.append(_gateway_pid(proc.pid, openai_port, log))
        assert _status(f"http://127.0.0.1:{openai_port}/v1/models") == 200
        assert _status(f"http://127.0.0.1:{openai_port}/health") == 503
        os.kill(gateways[0], signal.SIGKILL)
        gateways.append(_gateway_pid(proc.pid, openai_port, log, not_pid=gateways[0]))
        assert "voxcpm_gateway exited" in log.read_text()

        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        text = log.read_text()
        assert rc == 0, text
        assert not [p for p in gateways if Path(f"/proc/{p}").exists() and _pids_in_group(p)], "gateway left"
        assert "successfully unloaded 'echo'" in text and "successfully unloaded 'echo_stream'" in text
        deadline = time.monotonic() + 10
        while (_pids_in_group(server_pid) or _pids_in_group(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pids_in_group(server_pid) == [] and _pids_in_group(proc.pid) == [], "processes left after SIGTERM"
        names = sorted(p.name.split(".")[0] + "." + p.name.split(".")[-1] for p in tmp_path.glob("echo*"))
        assert names == ["echo.finalized", "echo.initialized", "echo_stream.finalized", "echo_stream.initialized"]
    finally:
        for pgid in (proc.pid, server_pid, *gateways):
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait()


def _gateway_pid(supervisor_pid: int, port: int, log: Path, not_pid: int | None = None) -> int:
    """The pid of the gateway the supervisor started (not `not_pid`), once it answers on `port`."""
    deadline = time.monotonic() + 60
    while True:
        pids = [p for p in _children(supervisor_pid) if p != not_pid and "voxcpm_gateway" in _cmdline(p)]
        if pids and _port_open(port):
            return pids[0]
        assert time.monotonic() < deadline, f"no gateway on port {port}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_helper_stop_reaps_everything(tmp_path):
    srv = TritonServer(ECHO_REPO, env={"ECHO_MARKER_DIR": str(tmp_path)})
    with srv:
        assert len(srv.stub_pids()) == 2
        pgid = srv.pid
    assert srv.returncode == 0, srv.log_tail()
    assert srv.leftover_processes == []
    assert _pids_in_group(pgid) == []
    assert len(list(tmp_path.glob("*.finalized"))) == 2


def test_a_stop_past_the_exit_timeout_leaves_the_stubs_stacks_in_the_log(tmp_path):
    """A server that does not stop in time exits 1 ("Exit timeout expired"); before that, the
    helper has each stub that handles SIGUSR2 (runtime.model_process) write its threads' stacks to
    the log, so that a rare failure in CI says where the stop was held up."""
    srv = TritonServer(EXIT_REPO, exit_timeout=8, env={"SPIN_FINALIZE_S": "16", "SPIN_MARKER_DIR": str(tmp_path)})
    with srv:
        assert len(srv.stub_pids()) == 1
        pgid = srv.pid
    log = srv.log
    assert _pids_in_group(pgid) == []  # the stub still in finalize is killed with the rest
    assert srv.returncode == 1 and "Exit timeout expired" in log, srv.log_tail()
    assert "still running 6 s after SIGTERM" in log, srv.log_tail()
    assert re.search(r'File ".*spinning/1/model.py", line \d+ in finalize', log), srv.log_tail()


def _supervise_exit_repo(tmp_path, env_extra: dict, *args: str) -> subprocess.Popen:
    """supervise.py over EXIT_REPO, its log in tmp_path/supervise.log."""
    http, grpc, metrics = _free_ports(3)
    env = triton_env()
    env.update(SPIN_MARKER_DIR=str(tmp_path), VOXCPM_PROBE_INTERVAL="0", **env_extra)
    with open(tmp_path / "supervise.log", "wb") as f:
        return subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "supervise.py"), *args, "--", env["TRITONSERVER_BIN"],
             f"--model-repository={EXIT_REPO}", f"--backend-directory={env['TRITON_BACKEND_DIR']}",
             "--http-address=127.0.0.1", f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
             "--metrics-address=127.0.0.1", f"--metrics-port={metrics}", "--exit-timeout-secs=3"],
            env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def test_the_supervisor_removes_what_a_server_out_of_its_exit_timeout_leaves_in_tmp(tmp_path):
    """Triton's python backend makes /tmp/python_env_XXXXXX (hard-coded, not $TMPDIR) and removes it
    only at a clean exit: a server that runs out its exit timeout (a finalize that never ends) or is
    killed leaves it. The supervisor removes the one its server made."""
    import glob

    before = set(glob.glob("/tmp/python_env_*"))
    proc = _supervise_exit_repo(tmp_path, {"SPIN_FINALIZE_S": "30"})
    log = tmp_path / "supervise.log"
    try:
        deadline = time.monotonic() + 120
        while "tritonserver ready" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.25)
        made = set(glob.glob("/tmp/python_env_*")) - before
        assert "tritonserver ready" in log.read_text() and len(made) == 1, (made, log.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = log.read_text()
    assert "Exit timeout expired" in text, text[-3000:]  # it did run out: the case this is about
    assert not made & set(glob.glob("/tmp/python_env_*")), text[-3000:]
    assert _pids_in_group(proc.pid) == []


def test_the_supervisor_removes_what_a_server_never_ready_leaves_in_tmp(tmp_path):
    """A server still loading when its start times out is killed; its python backend's directory
    (made before its first model process) goes with it."""
    import glob

    before = set(glob.glob("/tmp/python_env_*"))
    proc = _supervise_exit_repo(tmp_path, {"SPIN_INIT_S": "60"}, "--start-timeout=6", "--max-failed-starts=1")
    try:
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = (tmp_path / "supervise.log").read_text()
    assert "not ready after 6 s" in text and "giving up" in text, text[-3000:]
    assert "tritonserver ready" not in text, text[-3000:]
    assert set(glob.glob("/tmp/python_env_*")) <= before, text[-3000:]
    assert _pids_in_group(proc.pid) == []


@pytest.mark.parametrize("hook", [False, True], ids=["interpreter_teardown", "skip_teardown_at_exit"])
def test_a_daemon_thread_inside_torch_does_not_abort_its_model_process_at_exit(hook, tmp_path):
    """The interpreter's teardown ends a daemon thread that takes the GIL again with pthread_exit;
    inside a torch op (the GIL released in C++) that aborts the whole stub, which leaves a fatal
    error in the server's log. runtime.skip_teardown_at_exit (every model.py calls it) ends the
    process before, after the exit handlers registered later, with stdout flushed. Without it the
    abort shows: the fixture is the one the product's processes would hit."""
    srv = TritonServer(EXIT_REPO, env={"SPIN_EXIT_HOOK": str(int(hook)), "SPIN_MARKER_DIR": str(tmp_path)})
    with srv:
        assert len(srv.stub_pids()) == 1
        pid = srv.stub_pids()[0]
        srv.stop(timeout=60)
    log = srv.log
    assert srv.returncode == 0 and srv.leftover_processes == [], srv.log_tail()
    assert "successfully unloaded 'spinning'" in log, srv.log_tail()
    assert (tmp_path / f"atexit.{pid}").exists()  # the handler registered after it ran
    if hook:
        assert "Fatal Python error" not in log and "terminate called" not in log, srv.log_tail()
        assert f"spinning: exit handler ran in {pid}" in log, srv.log_tail()
    else:
        assert "terminate called without an active exception" in log, srv.log_tail()


def test_skip_teardown_at_exit_registers_nothing_outside_a_stub(monkeypatch):
    """In pytest (or any other Python) it must not end that process at its exit."""
    from voxcpm_triton.coordination import processes, runtime

    registered = []
    monkeypatch.setattr(atexit, "register", lambda *a, **k: registered.append(a))
    runtime.skip_teardown_at_exit()
    assert not processes.in_stub() and registered == []


def test_every_model_calls_skip_teardown_at_exit_before_anything_else_it_imports():
    """Torch's exit handlers must be registered after it (they then run first), and a model added
    without it would bring the abort back."""
    for path in sorted((REPO / "model_repository").glob("*/1/model.py")):
        body = ast.parse(path.read_text()).body
        call = next(i for i, node in enumerate(body) if ast.unparse(node) == "runtime.skip_teardown_at_exit()")
        imported = [n.module for n in body[:call] if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in body[:call] if isinstance(n, ast.Import) for a in n.names]
        assert set(imported) <= {"os", "sys", "voxcpm_triton.coordination"}, (path, imported)
        assert any(isinstance(n, ast.ImportFrom) and n.module.startswith("voxcpm_triton.serving.")
                   for n in body[call + 1:]), path


# --- deployment files -----------------------------------------------------------------------


def test_docker_compose_config_valid():
    exe = require_executable("docker-compose", "Debian's docker-compose, APT_PACKAGES")
    env = dict(os.environ, VOXCPM_CHECKPOINT="/tmp/voxcpm-checkpoint")
    r = subprocess.run(
        [exe, "-f", str(REPO / "docker-compose.yml"), "config"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    import yaml

    cfg = yaml.safe_load(r.stdout)
    assert set(cfg["services"]) == {"triton", "openai"}, cfg["services"]
    svc = cfg["services"]["triton"]
    assert "tritonserver" in " ".join(svc["command"] if isinstance(svc["command"], list) else [svc["command"]])
    assert "/workspace/scripts/probe.py" in " ".join(svc["healthcheck"]["test"])
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d.get("capabilities", []) for d in devices)
    published = {str(p.get("target", p)) if isinstance(p, dict) else str(p) for p in svc["ports"]}
    assert all(any(str(port) in p for p in published) for port in (8000, 8001, 8002)), published
    mounts = " ".join(v["source"] if isinstance(v, dict) else v for v in svc["volumes"])
    assert "model_repository" in mounts and "python_backend" in mounts and "/tmp/voxcpm-checkpoint" in mounts


def test_the_test_helper_removes_what_a_server_out_of_its_exit_timeout_leaves_in_tmp():
    """tests/server.py does for the suite's bare servers what the supervisor does: a server that runs
    out its exit timeout leaves the python backend's /tmp/python_env_XXXXXX, which the helper removes."""
    import glob

    before = set(glob.glob("/tmp/python_env_*"))
    srv = TritonServer(EXIT_REPO, env={"SPIN_FINALIZE_S": "30"}, exit_timeout=3).start()
    try:
        made = set(glob.glob("/tmp/python_env_*")) - before
        assert len(made) == 1 and srv.python_env in made, (made, srv.python_env)
    finally:
        rc = srv.stop()
    assert rc != 0 and "Exit timeout expired" in srv.log, srv.log_tail()  # it did run out
    assert not made & set(glob.glob("/tmp/python_env_*"))
    assert srv.leftover_processes == []
