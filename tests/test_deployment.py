"""Deployment files: the perf_analyzer wrapper (scripts/setup.sh), the Docker image's
packages (docker/Dockerfile) and docker-compose.yml.

Cheap except the perf_analyzer run against the echo fixture server (one tritonserver
start, a few seconds).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_executable
from tests.server import REPO, triton_env, venv_dir
from tests.server import triton_server_factory  # noqa: F401  (fixture)

DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
ECHO_REPO = REPO / "tests" / "fixtures" / "echo_repo"
WRAPPER_MARK = "voxcpm-perf-analyzer-wrapper"


def _plain_env(**extra: str) -> dict[str, str]:
    """A shell as a user has it: no LD_LIBRARY_PATH, no venv on PATH, no PYTHON*."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


# --- perf_analyzer runs as a user types it ---------------------------------------------------


def test_perf_analyzer_runs_from_a_plain_shell():
    venv = Path(venv_dir())
    pa = venv / "bin" / "perf_analyzer"
    assert pa.is_file(), f"{pa} missing (run scripts/setup.sh)"
    assert WRAPPER_MARK in pa.read_bytes()[:256].decode(errors="replace"), (
        f"{pa} is not the wrapper scripts/setup.sh installs (re-run scripts/setup.sh)"
    )
    r = subprocess.run([str(pa), "--version"], env=_plain_env(), cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Perf Analyzer Version" in r.stdout + r.stderr, r.stdout + r.stderr
    # tests and `bash scripts/triton_env.sh perf_analyzer` use PERF_ANALYZER_BIN: the same wrapper
    assert Path(triton_env()["PERF_ANALYZER_BIN"]).resolve() == pa.resolve()


def test_perf_analyzer_wrapper_against_echo_server(triton_server_factory, tmp_path):  # noqa: F811
    server = triton_server_factory(ECHO_REPO, env={"ECHO_MARKER_DIR": str(tmp_path)})
    pa = Path(venv_dir()) / "bin" / "perf_analyzer"
    cmd = [
        str(pa), "-m", "echo", "-u", server.http_url, "-i", "http", "--shape", "INPUT:16",
        "--concurrency-range", "1", "--request-count", "100",  # fixed count: no stability search
    ]  # fmt: skip
    r = subprocess.run(cmd, env=_plain_env(), cwd="/", capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"Throughput: ([\d.]+) infer/sec", out)
    assert m and float(m.group(1)) > 0, out


def test_setup_rewraps_perf_analyzer_after_a_pip_reinstall(tmp_path):
    """scripts/setup.sh on a throwaway venv that borrows the real one's lib/ (symlink) and
    stamp (so pip is skipped; a guard refuses pip if it were not): a fresh binary in bin/ is
    wrapped, a second run changes nothing, a pip reinstall (binary back in bin/) is wrapped
    again; each time the wrapper runs from a plain shell."""
    real = Path(venv_dir())
    elf = real / "libexec" / "perf_analyzer"
    if not elf.is_file():
        elf = real / "bin" / "perf_analyzer"
    assert elf.read_bytes()[:4] == b"\x7fELF", f"no perf_analyzer binary in {real}"
    stamp = real / ".voxcpm-setup-stamp"
    assert stamp.is_file(), f"{stamp} missing: scripts/setup.sh writes it after pip; run scripts/setup.sh"

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").symlink_to(real / "lib")
    shutil.copy(real / "pyvenv.cfg", venv / "pyvenv.cfg")
    shutil.copy(stamp, venv / ".voxcpm-setup-stamp")
    guard = venv / "bin" / "python"
    guard.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ]; then echo "TEST-GUARD: no pip here ($*)" >&2; exit 97; fi\n'
        f'exec {shlex.quote(str(real / "bin" / "python"))} "$@"\n'
    )
    guard.chmod(0o755)
    (venv / "bin" / "python3").symlink_to("python")

    env = dict(os.environ, VENV=str(venv), SKIP_APT="1", TRITON_BACKEND_DIR=str(tmp_path / "backends"))
    env.pop("FORCE_SETUP", None)
    env.pop("LD_LIBRARY_PATH", None)
    bin_pa = venv / "bin" / "perf_analyzer"

    def setup() -> str:
        r = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
        out = r.stdout + r.stderr
        # setup.sh with the stamp it wrote must not run pip again: if it does, either the venv is
        # out of date (run scripts/setup.sh) or setup.sh's stamp check is broken.
        assert "TEST-GUARD" not in out, f"setup.sh ran pip despite the venv's stamp (stale? run scripts/setup.sh):\n{out}"
        assert r.returncode == 0, out
        return out

    def check_wrapped() -> None:
        assert WRAPPER_MARK in bin_pa.read_text(), bin_pa.read_text()
        assert (venv / "libexec" / "perf_analyzer").read_bytes() == elf.read_bytes()
        r = subprocess.run([str(bin_pa), "--version"], env=_plain_env(), cwd="/", capture_output=True, text=True,
                           timeout=60)  # fmt: skip
        assert r.returncode == 0 and "Perf Analyzer Version" in r.stdout + r.stderr, r.stdout + r.stderr

    shutil.copy2(elf, bin_pa)  # as pip installs it
    out = setup()
    assert "perf_analyzer moved to" in out, out
    check_wrapped()

    before = bin_pa.stat()
    out = setup()
    assert "moved to" not in out, out
    after = bin_pa.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "second run rewrote the wrapper"
    check_wrapped()

    bin_pa.unlink()  # pip reinstall: the wrapper goes, the binary comes back
    shutil.copy2(elf, bin_pa)
    out = setup()
    assert "perf_analyzer moved to" in out, out
    check_wrapped()


# --- the image has what the served code imports ---------------------------------------------

# Import name -> PyPI distribution, where they differ or are worth stating. Names not here
# are looked up in this venv's installed distributions, else taken as they are.
PYPI_NAME = {
    "yaml": "pyyaml",
    "soundfile": "soundfile",
    "scipy": "scipy",
    "numpy": "numpy",
    "torch": "torch",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "tritonclient": "tritonclient",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "cv2": "opencv-python",
    "huggingface_hub": "huggingface-hub",
    "google": "protobuf",
}

# Modules that come with another package the Dockerfile installs. torch's Linux CUDA wheels
# (what the image installs) depend on the matching `triton` wheel, so the Triton-language
# kernels' `import triton` is served by torch; the code also treats triton as optional
# (try/except: the PyTorch path runs without it). A CPU-only torch would not bring it.
PROVIDED_BY = {"triton": "torch"}

# Provided at run time by the server itself, not by pip.
SERVER_PROVIDED = {"triton_python_backend_utils"}

# The project's own packages (mounted into the container, on sys.path via model.py or PYTHONPATH).
OWN_PACKAGES = {"voxcpm_triton", "voxcpm_gateway"}

# Third-party modules that only test-fixture generators import, which the server never
# needs: import name -> why. Keep it minimal; today nothing needs an exception
# (voxcpm_triton/testing/checkpoint_writer.py and tokenizer_builder.py, which write the tiny test
# checkpoint, import only torch/tokenizers, both in the image anyway).
FIXTURE_ONLY: dict[str, str] = {}


def served_python_files(repo: Path = REPO) -> list[Path]:
    files = sorted((repo / "python_backend" / "voxcpm_triton").rglob("*.py"))
    files += sorted(repo.glob("model_repository/*/1/model.py"))
    # the container's supervisor and its healthcheck (docker-compose.yml)
    files += [p for p in (repo / "scripts" / "supervise.py", repo / "scripts" / "probe.py") if p.is_file()]
    # the OpenAI gateway (docker-compose.yml's `openai` service, same image)
    files += sorted((repo / "gateway" / "voxcpm_gateway").rglob("*.py"))
    return files


def imported_modules(files) -> dict[str, set[str]]:
    """Top-level module -> files importing it; every import statement (module level, in
    functions, under try), absolute imports only (relative ones are the package's own)."""
    found: dict[str, set[str]] = {}
    for f in files:
        f = Path(f)
        tree = ast.parse(f.read_text(), filename=str(f))
        # outside a package (scripts/, a model's 1/ directory) a module next to the
        # importing file is local; inside one, siblings are imported relatively or by
        # the package's name
        in_package = (f.parent / "__init__.py").is_file()
        local = set() if in_package else {p.stem for p in f.parent.glob("*.py")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in local:
                    continue
                found.setdefault(top, set()).add(str(f.relative_to(REPO) if f.is_relative_to(REPO) else f))
    return found


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _pypi_name(module: str) -> str:
    if module in PYPI_NAME:
        return _norm(PYPI_NAME[module])
    import importlib.metadata

    dists = importlib.metadata.packages_distributions().get(module)
    return _norm(dists[0] if dists else module)


def required_distributions(files) -> dict[str, dict[str, set[str]]]:
    """PyPI distribution -> {import name -> files} for the third-party imports of ``files``."""
    need: dict[str, dict[str, set[str]]] = {}
    for mod, where in imported_modules(files).items():
        if mod in sys.stdlib_module_names or mod == "__future__":
            continue
        if mod in OWN_PACKAGES or mod in SERVER_PROVIDED or mod in FIXTURE_ONLY:
            continue
        dist = _norm(PROVIDED_BY.get(mod, "")) or _pypi_name(mod)
        need.setdefault(dist, {})[mod] = where
    return need


# pip install options that take a value (the value is not a package)
_PIP_OPTS_WITH_ARG = {
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint",
    "-r", "--requirement", "-t", "--target", "--prefix", "--root", "--upgrade-strategy",
    "--platform", "--python-version", "--implementation", "--abi", "--src", "--trusted-host",
    "--progress-bar", "--cache-dir", "--log", "--timeout", "--retries", "--proxy",
}  # fmt: skip


def dockerfile_pip_packages(text: str) -> set[str]:
    """Normalized names of the packages the Dockerfile's `pip install` commands name."""
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):  # comments, also inside a continued RUN
            continue
        lines.append(line)
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    pkgs: set[str] = set()
    for cmd in re.split(r"&&|\|\||[;|\n]", joined):
        try:
            words = shlex.split(cmd)
        except ValueError:
            continue
        for i in range(len(words) - 1):
            if re.fullmatch(r"pip3?(\.\d+)?", os.path.basename(words[i])) and words[i + 1] == "install":
                args = words[i + 2 :]
                break
        else:
            continue
        skip = False
        for a in args:
            if skip:
                skip = False
                continue
            if a.startswith("-"):
                skip = a in _PIP_OPTS_WITH_ARG
                continue
            m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", a)
            if m and "/" not in a and not a.startswith("$"):
                pkgs.add(_norm(m.group(0)))
    return pkgs


def missing_from_image(files, dockerfile_text: str) -> dict[str, dict[str, set[str]]]:
    have = dockerfile_pip_packages(dockerfile_text)
    return {d: mods for d, mods in required_distributions(files).items() if d not in have}


def test_served_files_are_found():
    files = served_python_files()
    names = {str(f.relative_to(REPO)) for f in files}
    assert "python_backend/voxcpm_triton/checks.py" in names
    assert len([n for n in names if n.startswith("model_repository/")]) >= 6, names
    mods = imported_modules(files)
    # the walk sees imports inside functions (checks.py imports scipy in its resampler)
    assert "scipy" in mods and "python_backend/voxcpm_triton/checks.py" in mods["scipy"]
    assert "torch" in mods and "numpy" in mods


def test_dockerfile_pip_parser():
    pkgs = dockerfile_pip_packages(DOCKERFILE.read_text())
    assert {"torch", "numpy", "safetensors", "tokenizers", "soundfile", "scipy"} <= pkgs, pkgs
    text = (
        "RUN set -eux; \\\n"
        "  # pip install commented-out \\\n"
        '  python3 -m pip install --index-url "$U" "torch==${V}" && pip3 install -q PyYAML[x]>=6 ./local.whl\n'
    )
    assert dockerfile_pip_packages(text) == {"torch", "pyyaml"}


def test_docker_image_installs_what_the_runtime_imports():
    missing = missing_from_image(served_python_files(), DOCKERFILE.read_text())
    assert not missing, "docker/Dockerfile does not pip install: " + "; ".join(
        f"{dist} (import {', '.join(sorted(mods))} in {', '.join(sorted(set().union(*mods.values())))})"
        for dist, mods in sorted(missing.items())
    )


def test_image_check_catches_a_new_import(tmp_path):
    """`import librosa` added to a served module without a Dockerfile line is caught,
    also inside a function and as `from X.y import z`."""
    mod = tmp_path / "served.py"
    mod.write_text("import numpy\n\ndef f():\n    from librosa.core import resample\n    return resample\n")
    missing = missing_from_image([mod], DOCKERFILE.read_text())
    assert set(missing) == {"librosa"}, missing
    assert not missing_from_image([mod], DOCKERFILE.read_text() + "RUN python3 -m pip install librosa\n")


def test_dockerfile_default_image_has_the_security_fixes():
    text = DOCKERFILE.read_text()
    m = re.search(r"^ARG TRITON_IMAGE=nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3\s*$", text, re.M)
    assert m, "TRITON_IMAGE build arg with an NGC tritonserver default expected"
    assert (int(m.group(1)), int(m.group(2))) >= (25, 8), m.group(0)
    assert re.search(r"^FROM \$\{TRITON_IMAGE\}\s*$", text, re.M)


# --- docker-compose.yml ------------------------------------------------------------------------

def _readme_env(*kinds: str) -> tuple[str, ...]:
    """The variables of the README's configuration rows whose first column is one of `kinds`."""
    names = []
    for line in (REPO / "README.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) > 2 and cells[0][2:] in kinds:
            names += re.findall(r"`((?:VOXCPM|TRITON)_[A-Z0-9_]+)`", cells[1])
    return tuple(dict.fromkeys(names))


# the README's env switches for the container (the secrets too) and the gateway's settings
TUNING_FLAGS = tuple(k for k in _readme_env("env (`scripts/serve.sh`, container)")
                     if k not in ("VOXCPM_ADMIN_KEY", "VOXCPM_INTERNAL_KEY")) + ("VOXCPM_DEVICE", "VOXCPM_DTYPE")
GATEWAY_VARS = tuple(k for k in _readme_env("gateway flags (env)", "env (gateway)")
                     if k != "VOXCPM_TRITON_GRPC_URL")  # compose points the gateway at its triton service
_COMPOSE_VARS = ("TRITON_BIND", "TRITON_HTTP_BIND", "TRITON_HTTP_PORT", "TRITON_GRPC_PORT", "TRITON_METRICS_PORT",
                 "VOXCPM_ADMIN_KEY", "VOXCPM_INTERNAL_KEY", "VOXCPM_CHECKPOINT", "OPENAI_API_PORT",
                 "VOXCPM_LORA_DIR") + TUNING_FLAGS + GATEWAY_VARS  # fmt: skip


def _compose_config(service: str = "triton", **env_vars: str) -> dict:
    exe = require_executable("docker-compose", "Debian's docker-compose, APT_PACKAGES")
    env = {k: v for k, v in os.environ.items() if k not in _COMPOSE_VARS and not k.startswith("COMPOSE_")}
    env.update(env_vars)
    r = subprocess.run([exe, "-f", str(COMPOSE), "config"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    import yaml

    services = yaml.safe_load(r.stdout)["services"]
    assert set(services) == {"triton", "openai"}, services
    return services[service]


def _ports(svc: dict) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port), from the short or the long syntax."""
    out = {}
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            out[int(p["target"])] = (p.get("host_ip", ""), int(p["published"]))
        else:
            m = re.fullmatch(r"(?:(.*):)?(\d+):(\d+)(?:/\w+)?", str(p))
            assert m, p
            out[int(m.group(3))] = (m.group(1) or "", int(m.group(2)))
    return out


def _seconds(d) -> float:
    if isinstance(d, (int, float)):  # compose v2 may print nanoseconds
        return d / 1e9 if d > 1e6 else float(d)
    total = 0.0
    for n, unit in re.findall(r"([\d.]+)(ms|h|m|s)", str(d)):
        total += float(n) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def _env(svc: dict) -> dict[str, str | None]:
    """The service's environment; None for a variable passed through but unset."""
    e = svc.get("environment", {})
    if isinstance(e, list):
        e = dict(x.split("=", 1) if "=" in x else (x, None) for x in e)
    return {k: None if v is None else str(v) for k, v in e.items()}


def test_compose_publishes_on_loopback_by_default():
    loopback = {8000: ("127.0.0.1", 8000), 8001: ("127.0.0.1", 8001), 8002: ("127.0.0.1", 8002)}
    assert _ports(_compose_config()) == loopback
    svc = _compose_config(TRITON_BIND="0.0.0.0", TRITON_HTTP_PORT="18000")  # HTTP stays on the loopback
    assert _ports(svc) == {8000: ("127.0.0.1", 18000), 8001: ("0.0.0.0", 8001), 8002: ("0.0.0.0", 8002)}
    svc = _compose_config(TRITON_BIND="0.0.0.0", TRITON_HTTP_BIND="0.0.0.0")
    assert _ports(svc) == {8000: ("0.0.0.0", 8000), 8001: ("0.0.0.0", 8001), 8002: ("0.0.0.0", 8002)}


def test_compose_runs_the_supervisor_listening_inside_the_container():
    svc = _compose_config()
    cmd = svc["command"] if isinstance(svc["command"], list) else shlex.split(svc["command"])
    assert cmd[:4] == ["python3", "/workspace/scripts/supervise.py", "--", "tritonserver"], cmd
    for flag in ("--model-repository=/workspace/model_repository", "--http-port=8000", "--grpc-port=8001",
                 "--metrics-port=8002", "--http-address=0.0.0.0", "--grpc-address=0.0.0.0",
                 "--metrics-address=0.0.0.0"):  # fmt: skip
        assert flag in cmd, (flag, cmd)
    vols = []
    for v in svc["volumes"]:
        if isinstance(v, dict):
            vols.append((v.get("source", ""), v["target"], bool(v.get("read_only"))))
        else:
            src, dst, *mode = v.split(":")
            vols.append((src, dst, "ro" in mode))
    assert (str(REPO / "scripts"), "/workspace/scripts", True) in vols, vols
    assert svc["restart"] == "unless-stopped"


def test_compose_healthcheck_is_the_probe():
    hc = _compose_config()["healthcheck"]
    test = hc["test"] if isinstance(hc["test"], list) else ["CMD-SHELL", hc["test"]]
    assert test[0] == "CMD", test
    assert test[1:5] == ["python3", "/workspace/scripts/probe.py", "--url", "http://127.0.0.1:8000"], test
    assert test[5] == "--timeout" and float(test[6]) < _seconds(hc["timeout"]) == 30, (test, hc)  # probe's own verdict
    assert test[7:] == ["--metrics-url", "http://127.0.0.1:8002"], test  # queued behind work is alive
    assert _seconds(hc["start_period"]) >= 600, hc
    assert _seconds(hc["interval"]) >= _seconds(hc["timeout"]), hc
    assert int(hc.get("retries", 3)) >= 1


def test_compose_passes_the_keys_through():
    """Set on the host: passed to the container. Unset: unset in the container too (not
    an empty string, which would read as a set but empty secret), so the supervisor
    generates them."""
    env = _env(_compose_config(VOXCPM_ADMIN_KEY="adm1n", VOXCPM_INTERNAL_KEY="int3rnal"))
    assert env["VOXCPM_ADMIN_KEY"] == "adm1n" and env["VOXCPM_INTERNAL_KEY"] == "int3rnal", env
    env = _env(_compose_config())
    for k in ("VOXCPM_ADMIN_KEY", "VOXCPM_INTERNAL_KEY"):
        assert env.get(k) is None, (k, env)


@pytest.mark.parametrize("service, names, one", [("triton", TUNING_FLAGS, "VOXCPM_FUSED_STACKS"),
                                                 ("openai", GATEWAY_VARS, "VOXCPM_OPENAI_MODEL_NAME")])
def test_compose_passes_the_readmes_env_settings_through(service, names, one):
    """The README's env rows for the container (and the gateway's) reach it when set on the host,
    and stay unset there (the code's defaults) when not."""
    assert len(names) >= 4 and one in names  # the rows were found
    env = _env(_compose_config(service, **dict.fromkeys(names, "0")))
    assert {k: env.get(k) for k in names} == dict.fromkeys(names, "0"), env
    env = _env(_compose_config(service))
    assert all(env.get(k) is None for k in names), env


def test_compose_scripts_exist():
    """The container runs scripts/supervise.py (python_backend/voxcpm_triton/supervisor) and its healthcheck
    scripts/probe.py (mounted from the checkout): they must be there."""
    for name in ("supervise.py", "probe.py"):
        assert (REPO / "scripts" / name).is_file(), f"docker-compose.yml needs scripts/{name}"


def test_compose_keeps_voices_on_a_named_volume():
    """Stored voices (model `voices`) outlive the container: VOXCPM_VOICES_DIR is a named volume."""
    svc = _compose_config()
    voices_dir = _env(svc)["VOXCPM_VOICES_DIR"]
    mounts = {}
    for v in svc["volumes"]:
        if isinstance(v, dict):
            mounts[v["target"]] = (v.get("type", "volume"), v.get("source", ""), bool(v.get("read_only")))
        else:
            src, dst, *mode = v.split(":")
            mounts[dst] = ("bind" if src.startswith(("/", ".")) else "volume", src, "ro" in mode)
    assert voices_dir and voices_dir in mounts, (voices_dir, mounts)
    kind, source, read_only = mounts[voices_dir]
    assert kind == "volume" and not read_only, mounts[voices_dir]
    assert source.split("_")[-1] == "voices", source  # compose may prefix the project name


def test_compose_mounts_the_hosts_lora_dir_only_when_given(tmp_path):
    """VOXCPM_LORA_DIR on the host: that folder, read-only at the same path, is the decoder's LoRA
    directory. Unset: unset in the container too (LoRA off, the plain decode graphs)."""
    def mounts(svc):
        return {(v["target"] if isinstance(v, dict) else v.split(":")[1]):
                (v.get("source", "") if isinstance(v, dict) else v.split(":")[0],
                 bool(v.get("read_only")) if isinstance(v, dict) else "ro" in v.split(":")[2:])
                for v in svc["volumes"]}

    host = str(tmp_path / "loras")
    svc = _compose_config(VOXCPM_LORA_DIR=host)
    assert _env(svc)["VOXCPM_LORA_DIR"] == host
    assert mounts(svc)[host] == (host, True), mounts(svc)
    svc = _compose_config()
    assert _env(svc).get("VOXCPM_LORA_DIR") is None
    assert not [t for t, (src, _) in mounts(svc).items() if "lora" in src and src.startswith("/")], mounts(svc)


def test_compose_runs_the_openai_gateway_beside_triton():
    """The `openai` service: the same image, the gateway pointed at triton's gRPC port, published on
    the loopback by default, its healthcheck the gateway's /health, the API key passed through."""
    svc = _compose_config("openai")
    assert svc["image"] == _compose_config()["image"]
    cmd = svc["command"] if isinstance(svc["command"], list) else shlex.split(svc["command"])
    assert cmd[:3] == ["python3", "-m", "voxcpm_gateway"] and "--triton-url=triton:8001" in cmd, cmd
    assert "--port=9000" in cmd and "--host=0.0.0.0" in cmd, cmd
    assert _env(svc)["PYTHONPATH"] == "/workspace/gateway"
    assert (str(REPO / "gateway"), "/workspace/gateway", True) in [
        (v["source"], v["target"], bool(v.get("read_only"))) if isinstance(v, dict) else tuple(v.split(":")[:2]) +
        ("ro" in v.split(":")[2:],) for v in svc["volumes"]]
    assert _ports(svc) == {9000: ("127.0.0.1", 9000)}
    assert _ports(_compose_config("openai", TRITON_BIND="0.0.0.0", OPENAI_API_PORT="19000")) == {
        9000: ("0.0.0.0", 19000)}
    hc = svc["healthcheck"]
    assert hc["test"][0] == "CMD" and "http://127.0.0.1:9000/health" in " ".join(hc["test"]), hc
    assert _seconds(hc["start_period"]) >= 600
    assert svc["restart"] == "unless-stopped" and "triton" in svc["depends_on"]
    assert _env(svc)["VOXCPM_OPENAI_API_KEY"] is None
    assert _env(_compose_config("openai", VOXCPM_OPENAI_API_KEY="sk-1"))["VOXCPM_OPENAI_API_KEY"] == "sk-1"


def test_every_readme_bash_block_parses():
    """A README command a user pastes must at least be valid shell: an apostrophe inside a '...'
    JSON body once left the LoRA example waiting at bash's continuation prompt."""
    blocks = [(readme, b) for readme in ("README.md", "client/README.md")
              for b in re.findall(r"```bash\n(.*?)```", (REPO / readme).read_text(), re.S)]
    assert blocks
    for name, block in blocks:
        r = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True)
        assert r.returncode == 0, f"{name}: a bash block does not parse: {r.stderr}\n{block}"


def test_the_readme_names_every_metric_the_models_export():
    """Each metric a model process or the gateway declares is described in the README."""
    readme = (REPO / "README.md").read_text()
    names = set()
    for path in [*(REPO / "python_backend" / "voxcpm_triton").rglob("*.py"), *(REPO / "gateway").rglob("*.py")]:
        src = path.read_text()
        names.update(re.findall(r'(?:metric|Counter|Gauge|Histogram)\(\s*"(voxcpm_[a-z_]+)"', src))
        names.update(re.findall(r'^\s*"(voxcpm_[a-z_]+)", "', src, re.MULTILINE))  # metric( on the line above
    assert len(names) > 30, names
    # prometheus_client's Counter("x") is exported as x_total
    assert sorted(n for n in names if not re.search(rf"\b{n}(_total)?\b", readme)) == []
