# shellcheck shell=bash
# Run this project's Triton server on the GPU box (no tritonserver installed,
# no network) from the bundle that gpu_box/make_device_bundle.sh built here.
#
# On the device, from the repository root (the working-tree copy; the bundle
# travels as an ignored path: carry [".cache/device_bundle"]):
#
#   source gpu_box/device_serve_env.sh        # unpack (once), export, diagnose
#   device_triton_selftest                    # tritonserver + stub + torch/CUDA probe
#   VOXCPM_CHECKPOINT=/path/to/ckpt device_triton_start   # model_repository, background
#   python3 benchmarks/bench_served.py --url 127.0.0.1:$TRITON_GRPC_PORT ...
#   device_triton_stop
#
# What `source` does:
#   * unpacks $TRITON_BUNDLE_TAR into $TRITON_BUNDLE_DIR (/tmp/tritonbundle),
#     again only when the tarball's sha256 changed;
#   * PATH: $DEVICE_VENV/bin first, so the first python3 is the device's
#     (the stub's embedded Python takes sys.prefix from the first python3 on
#     PATH, and with it the venv's site-packages: torch, numpy, ...);
#   * numpy 2.x on the device: the Triton 2.51 stub (old pybind11) makes EMPTY
#     output tensors with numpy 2 (it reads the dtype's item size at the numpy-1
#     offset). Then an overlay venv $TRITON_BUNDLE_DIR/stubvenv.pyX.Y goes first
#     on PATH instead: the same base interpreter, the bundle's numpy 1.26.4
#     first, then everything in $DEVICE_VENV's site-packages (a .pth running
#     site.addsitedir). DEVICE_NUMPY1=auto|1|0 (auto: only under numpy >= 2);
#   * builds $TRITON_BACKEND_DIR/python = libtriton_python.so +
#     triton_python_backend_utils.py + the stub for that python's X.Y;
#   * LD_LIBRARY_PATH: the bundle's lib/ (tritonserver's and the stub's libs);
#     the stub also needs libpython3.12.so.1.0: the system's if the loader finds
#     it, else the one in python's sysconfig LIBDIR / base prefix lib/, else the
#     bundle's last-resort copy (pylib/, another 3.12 patch level: a warning);
#   * PYTHONPATH: the bundle's tritonclient (grpc) + python_backend first, the
#     bundle's packaging/rapidjson last (the device's own versions win);
#   * exports TRITONSERVER_BIN TRITON_BACKEND_DIR TRITON_PYVER REPO VENV
#     VOXCPM_PYTHON_BACKEND like scripts/triton_env.sh, and prints a diagnosis
#     (`ldd ... | grep "not found"`, python package versions, /dev/shm, GPUs).
#
# Inputs (environment): TRITON_BUNDLE_TAR (default
# $REPO/.cache/device_bundle/tritonbundle.tar.xz), TRITON_BUNDLE_DIR
# (/tmp/tritonbundle), DEVICE_VENV (/opt/torch/.venv), DEVICE_NUMPY1 (auto),
# DEVICE_ENV_QUIET=1 (no diagnosis), TRITON_HTTP_PORT/TRITON_GRPC_PORT/TRITON_METRICS_PORT
# (8000/8001/8002), MODEL_REPOSITORY ($REPO/model_repository),
# DEVICE_TRITON_LOG (/tmp/tritonserver.log), DEVICE_TRITON_READY_TIMEOUT (900 s).
#
# Sourcing never exits the caller's shell; device_env_ok (0/1) says whether
# everything needed was found.

_dse_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="${REPO:-$(cd "$_dse_here/.." && pwd)}"
DEVICE_VENV="${DEVICE_VENV:-/opt/torch/.venv}"
TRITON_BUNDLE_TAR="${TRITON_BUNDLE_TAR:-$REPO/.cache/device_bundle/tritonbundle.tar.xz}"
TRITON_BUNDLE_DIR="${TRITON_BUNDLE_DIR:-/tmp/tritonbundle}"
TRITON_HTTP_PORT="${TRITON_HTTP_PORT:-8000}"
TRITON_GRPC_PORT="${TRITON_GRPC_PORT:-8001}"
TRITON_METRICS_PORT="${TRITON_METRICS_PORT:-8002}"
DEVICE_TRITON_LOG="${DEVICE_TRITON_LOG:-/tmp/tritonserver.log}"
DEVICE_TRITON_READY_TIMEOUT="${DEVICE_TRITON_READY_TIMEOUT:-900}"

# `VAR=x source ...` keeps VAR only while sourcing: remember the settings, and
# let the functions below fall back to them.
_dse_bundle_tar="$TRITON_BUNDLE_TAR" _dse_bundle_dir="$TRITON_BUNDLE_DIR" _dse_venv="$DEVICE_VENV"
_dse_http="$TRITON_HTTP_PORT" _dse_grpc="$TRITON_GRPC_PORT" _dse_metrics="$TRITON_METRICS_PORT"
_dse_log="$DEVICE_TRITON_LOG" _dse_ready="$DEVICE_TRITON_READY_TIMEOUT" _dse_quiet="${DEVICE_ENV_QUIET:-0}"
_dse_numpy1="${DEVICE_NUMPY1:-auto}"
_dse_cfg() {
    : "${TRITON_BUNDLE_TAR:=$_dse_bundle_tar}" "${TRITON_BUNDLE_DIR:=$_dse_bundle_dir}" "${DEVICE_VENV:=$_dse_venv}"
    : "${TRITON_HTTP_PORT:=$_dse_http}" "${TRITON_GRPC_PORT:=$_dse_grpc}" "${TRITON_METRICS_PORT:=$_dse_metrics}"
    : "${DEVICE_TRITON_LOG:=$_dse_log}" "${DEVICE_TRITON_READY_TIMEOUT:=$_dse_ready}" "${DEVICE_ENV_QUIET:=$_dse_quiet}"
    : "${DEVICE_NUMPY1:=$_dse_numpy1}"
    export TRITON_BUNDLE_DIR TRITON_HTTP_PORT TRITON_GRPC_PORT TRITON_METRICS_PORT
}

_dse_say() { echo "[device_env] $*" >&2; }

# Unpack the bundle unless the same tarball is already unpacked there.
device_bundle_unpack() {
    _dse_cfg
    local sum stamp="$TRITON_BUNDLE_DIR/.bundle.sha256" parent tmp
    if [[ ! -f $TRITON_BUNDLE_TAR ]]; then
        if [[ -x $TRITON_BUNDLE_DIR/bin/tritonserver ]]; then
            _dse_say "no $TRITON_BUNDLE_TAR; using the unpacked $TRITON_BUNDLE_DIR"
            return 0
        fi
        _dse_say "ERROR: no bundle at $TRITON_BUNDLE_TAR (build it with gpu_box/make_device_bundle.sh and carry .cache/device_bundle)"
        return 1
    fi
    sum="$(sha256sum "$TRITON_BUNDLE_TAR" | cut -d' ' -f1)"
    if [[ -f $stamp && $(cat "$stamp") == "$sum" && -x $TRITON_BUNDLE_DIR/bin/tritonserver ]]; then
        return 0
    fi
    parent="$(dirname "$TRITON_BUNDLE_DIR")"
    mkdir -p "$parent" || return 1
    tmp="$(mktemp -d "$parent/.tritonbundle.XXXXXX")" || return 1
    _dse_say "unpacking $TRITON_BUNDLE_TAR ($(du -h "$TRITON_BUNDLE_TAR" | cut -f1)) -> $TRITON_BUNDLE_DIR"
    if ! tar -C "$tmp" -xJf "$TRITON_BUNDLE_TAR"; then
        rm -rf "$tmp"
        _dse_say "ERROR: could not unpack $TRITON_BUNDLE_TAR"
        return 1
    fi
    echo "$sum" > "$tmp/tritonbundle/.bundle.sha256"
    rm -rf "$TRITON_BUNDLE_DIR"
    mv "$tmp/tritonbundle" "$TRITON_BUNDLE_DIR" && rmdir "$tmp"
}

# Print the "not found" lines of ldd for $1 (with the current LD_LIBRARY_PATH).
_dse_missing() { ldd "$1" 2>&1 | grep "not found" || true; }

# Make libpython$TRITON_PYVER.so.1.0 resolvable for the stub.
device_libpython_resolve() {
    _dse_cfg
    local stub="$TRITON_BACKEND_DIR/python/triton_python_backend_stub" so="libpython$TRITON_PYVER.so.1.0" d
    DEVICE_LIBPYTHON_SOURCE=""
    if [[ -z $(_dse_missing "$stub" | grep "$so") ]]; then
        DEVICE_LIBPYTHON_SOURCE="system: $(ldd "$stub" | sed -n "s/.*$so => \([^ ]*\).*/\1/p")"
        return 0
    fi
    [[ ${DEVICE_ENV_QUIET:-0} == 1 ]] || _dse_say "stub without help: $(_dse_missing "$stub" | tr -s ' \t' ' ')"
    for d in $(python3 - <<'EOF' 2>/dev/null
import os, sys, sysconfig
for d in (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib"),
          os.path.join(sys.base_exec_prefix, "lib"), os.path.dirname(os.path.realpath(sys.executable)) + "/../lib"):
    if d:
        print(os.path.realpath(d))
EOF
    ); do
        if [[ -f $d/$so ]]; then
            LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
            DEVICE_LIBPYTHON_SOURCE="python's own: $d/$so"
            return 0
        fi
    done
    if [[ -f $TRITON_BUNDLE_DIR/pylib/$so ]]; then
        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$TRITON_BUNDLE_DIR/pylib"
        DEVICE_LIBPYTHON_SOURCE="BUNDLED FALLBACK $TRITON_BUNDLE_DIR/pylib/$so ($(grep -m1 '^fallback libpython' "$TRITON_BUNDLE_DIR/MANIFEST.txt" 2>/dev/null))"
        _dse_say "WARNING: the device has no $so; using the bundle's copy (it may differ in patch level from $(python3 -V 2>&1))"
        return 0
    fi
    DEVICE_LIBPYTHON_SOURCE="MISSING"
    return 1
}

# The python whose prefix the stub takes: $DEVICE_VENV, or (numpy 2.x there)
# an overlay venv with the bundle's numpy 1.26.4 ahead of $DEVICE_VENV's packages.
# Sets DEVICE_STUB_VENV and DEVICE_NUMPY_NOTE.
device_stub_venv_setup() {
    _dse_cfg
    local py="$DEVICE_VENV/bin/python3" np_ver pyver sv base sp dsp
    read -r pyver np_ver < <("$py" -c 'import sys
try:
    import numpy; v = numpy.__version__
except Exception:
    v = "none"
print("%d.%d" % sys.version_info[:2], v)') || return 1
    DEVICE_STUB_VENV="$DEVICE_VENV"
    DEVICE_NUMPY_NOTE="device numpy $np_ver"
    case "$DEVICE_NUMPY1" in
        0) return 0 ;;
        1) ;;
        *) [[ $np_ver == none || ${np_ver%%.*} -lt 2 ]] && return 0 ;;
    esac
    if [[ ! -d $TRITON_BUNDLE_DIR/numpy1/$pyver/numpy ]]; then
        DEVICE_NUMPY_NOTE="$DEVICE_NUMPY_NOTE: WARNING no numpy1/$pyver in the bundle: the stub's output tensors will be EMPTY under numpy 2"
        return 0
    fi
    sv="$TRITON_BUNDLE_DIR/stubvenv.py$pyver"
    base="$("$py" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))')" || return 1
    sp="$sv/lib/python$pyver/site-packages"
    dsp="$("$py" -c 'import os, site; print(" ".join(d for d in site.getsitepackages() if os.path.isdir(d)))')" || return 1
    mkdir -p "$sv/bin" "$sp" || return 1
    ln -sfn "$base" "$sv/bin/python3"
    ln -sfn python3 "$sv/bin/python"
    ln -sfn python3 "$sv/bin/python$pyver"
    printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\n' "$(dirname "$base")" \
        "$("$py" -c 'import platform; print(platform.python_version())')" > "$sv/pyvenv.cfg"
    echo "$TRITON_BUNDLE_DIR/numpy1/$pyver" > "$sp/00-tritonbundle-numpy1.pth"
    # one `import` line per directory (site exec()s each line on its own)
    local d
    for d in $dsp; do echo "import site; site.addsitedir('$d')"; done > "$sp/zz-device-venv.pth"
    DEVICE_STUB_VENV="$sv"
    DEVICE_NUMPY_NOTE="$DEVICE_NUMPY_NOTE >= 2: the stub's python is the overlay $sv (numpy $("$sv/bin/python3" -c 'import numpy; print(numpy.__version__)' 2>&1), then $dsp)"
}

device_env_export() {
    _dse_cfg
    device_bundle_unpack || return 1
    if [[ ! -x $DEVICE_VENV/bin/python3 ]]; then
        _dse_say "ERROR: no python3 in DEVICE_VENV=$DEVICE_VENV"
        return 1
    fi
    device_stub_venv_setup || { _dse_say "ERROR: could not set up the stub's python"; return 1; }
    PATH="$DEVICE_STUB_VENV/bin:$DEVICE_VENV/bin:${PATH:-/usr/bin:/bin}"
    hash -r
    VENV="$DEVICE_STUB_VENV"
    TRITON_PYVER="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || return 1
    TRITONSERVER_BIN="$TRITON_BUNDLE_DIR/bin/tritonserver"
    TRITON_BACKEND_DIR="$TRITON_BUNDLE_DIR/backends.py$TRITON_PYVER"
    local stub="$TRITON_BUNDLE_DIR/stubs/$TRITON_PYVER/triton_python_backend_stub" dst f
    if [[ ! -f $stub ]]; then
        _dse_say "ERROR: the bundle has no stub for Python $TRITON_PYVER (has: $(ls "$TRITON_BUNDLE_DIR/stubs" | tr '\n' ' '); BUNDLE_PYVERS when building)"
        return 1
    fi
    dst="$TRITON_BACKEND_DIR/python"
    mkdir -p "$dst"
    for f in "$TRITON_BUNDLE_DIR"/backends/python/*; do
        cmp -s "$f" "$dst/$(basename "$f")" || cp "$f" "$dst/"
    done
    cmp -s "$stub" "$dst/triton_python_backend_stub" || cp "$stub" "$dst/triton_python_backend_stub"
    chmod 755 "$dst/triton_python_backend_stub"
    LD_LIBRARY_PATH="$TRITON_BUNDLE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    device_libpython_resolve
    VOXCPM_PYTHON_BACKEND="${VOXCPM_PYTHON_BACKEND:-$REPO/python_backend}"
    PYTHONPATH="$TRITON_BUNDLE_DIR/python:$REPO/python_backend${PYTHONPATH:+:$PYTHONPATH}:$TRITON_BUNDLE_DIR/pyfallback"
    unset PYTHONHOME
    MODEL_REPOSITORY="${MODEL_REPOSITORY:-$REPO/model_repository}"
    export REPO VENV PATH TRITON_PYVER TRITONSERVER_BIN TRITON_BACKEND_DIR LD_LIBRARY_PATH PYTHONPATH \
        VOXCPM_PYTHON_BACKEND MODEL_REPOSITORY TRITON_BUNDLE_DIR TRITON_HTTP_PORT TRITON_GRPC_PORT \
        TRITON_METRICS_PORT DEVICE_LIBPYTHON_SOURCE DEVICE_STUB_VENV DEVICE_NUMPY_NOTE
}

device_env_report() {
    _dse_cfg
    local stub="$TRITON_BACKEND_DIR/python/triton_python_backend_stub" f m
    _dse_say "python3: $(command -v python3) -> $(python3 -c 'import sys; print(sys.version.split()[0], "base_prefix", sys.base_prefix)' 2>&1)"
    _dse_say "libpython$TRITON_PYVER.so.1.0: $DEVICE_LIBPYTHON_SOURCE"
    _dse_say "numpy: $DEVICE_NUMPY_NOTE"
    for f in "$TRITONSERVER_BIN" "$TRITON_BACKEND_DIR/python/libtriton_python.so" "$stub"; do
        m="$(_dse_missing "$f")"
        _dse_say "ldd ${f#"$TRITON_BUNDLE_DIR"/} | grep 'not found': ${m:-(none)}"
    done
    python3 - <<'EOF' 2>&1 | sed 's/^/[device_env] /' >&2
import importlib
for mod in ("numpy", "grpc", "google.protobuf", "packaging", "rapidjson"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod} {getattr(m, '__version__', '?')} ({m.__file__})")
    except Exception as e:
        print(f"{mod}: MISSING ({type(e).__name__}: {e})")
try:
    import tritonclient.grpc  # noqa: F401
    print("tritonclient.grpc: import ok")
except Exception as e:
    print(f"tritonclient.grpc: IMPORT FAILS: {type(e).__name__}: {e}")
EOF
    _dse_say "/dev/shm: $(df -h /dev/shm 2>/dev/null | awk 'NR==2 {print $2 " size, " $4 " free"}') (python backend tensors go through it)"
    if command -v nvidia-smi >/dev/null; then
        _dse_say "GPUs: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tr '\n' ';')"
    fi
}

# device_env_ok: everything tritonserver and the stub link against resolves.
device_env_ok() {
    _dse_cfg
    [[ -x ${TRITONSERVER_BIN:-} ]] || return 1
    [[ -z $(_dse_missing "$TRITONSERVER_BIN") ]] || return 1
    [[ -z $(_dse_missing "$TRITON_BACKEND_DIR/python/triton_python_backend_stub") ]] || return 1
}

_dse_wait_ready() {  # _dse_wait_ready PID HTTP_PORT TIMEOUT
    python3 - "$@" <<'EOF'
import os, sys, time, urllib.request
pid, port, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        print(f"tritonserver (pid {pid}) exited before it was ready", file=sys.stderr)
        sys.exit(2)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
print(f"tritonserver not ready after {timeout:.0f} s", file=sys.stderr)
sys.exit(1)
EOF
}

# _dse_ports_free: fail, naming it, when something already listens on one of the server's ports
# (a server left over from an interrupted run would answer the readiness probe and the benchmark).
_dse_ports_free() {
    _dse_cfg
    python3 - "$TRITON_HTTP_PORT" "$TRITON_GRPC_PORT" "$TRITON_METRICS_PORT" <<'EOF'
import socket, sys
busy = []
for port in sys.argv[1:]:
    with socket.socket() as s:
        s.settimeout(1)
        if s.connect_ex(("127.0.0.1", int(port))) == 0:
            busy.append(port)
if busy:
    print(f"[device_env] port(s) {', '.join(busy)} on 127.0.0.1 already in use (a tritonserver left running?): "
          "not starting another", file=sys.stderr)
    sys.exit(1)
EOF
}

# device_triton_start [MODEL_REPOSITORY] [extra tritonserver args...]: start in
# the background (own session), wait for /v2/health/ready. PID in
# $DEVICE_TRITON_PID, log in $DEVICE_TRITON_LOG.
device_triton_start() {
    _dse_cfg
    local repo="${1:-$MODEL_REPOSITORY}"
    (($#)) && shift
    device_env_ok || { _dse_say "ERROR: environment incomplete (see the ldd lines above)"; return 1; }
    _dse_ports_free || return 1
    : > "$DEVICE_TRITON_LOG"
    setsid "$TRITONSERVER_BIN" --model-repository="$repo" --backend-directory="$TRITON_BACKEND_DIR" \
        --http-address=127.0.0.1 --http-port="$TRITON_HTTP_PORT" \
        --grpc-address=127.0.0.1 --grpc-port="$TRITON_GRPC_PORT" \
        --metrics-address=127.0.0.1 --metrics-port="$TRITON_METRICS_PORT" \
        --allow-metrics=true --log-verbose="${TRITON_LOG_VERBOSE:-0}" \
        --exit-timeout-secs="${TRITON_EXIT_TIMEOUT:-30}" "$@" \
        >> "$DEVICE_TRITON_LOG" 2>&1 < /dev/null &
    DEVICE_TRITON_PID=$!
    export DEVICE_TRITON_PID
    _dse_say "tritonserver pid $DEVICE_TRITON_PID repo=$repo grpc 127.0.0.1:$TRITON_GRPC_PORT log $DEVICE_TRITON_LOG"
    if ! _dse_wait_ready "$DEVICE_TRITON_PID" "$TRITON_HTTP_PORT" "$DEVICE_TRITON_READY_TIMEOUT"; then
        tail -n 60 "$DEVICE_TRITON_LOG" >&2
        device_triton_stop
        return 1
    fi
    _dse_say "ready after $(grep -c "successfully loaded" "$DEVICE_TRITON_LOG") model load(s)"
}

# Live processes of process group $1 (the server and its python stubs).
_dse_group_pids() { ps -eo pid=,pgid= 2>/dev/null | awk -v g="$1" '$2 == g { print $1 }'; }

# device_triton_stop: SIGTERM the server started above and wait; SIGKILL what is
# left of its process group (stubs included, e.g. after a crash) after 60 s.
device_triton_stop() {
    _dse_cfg
    local pid="${DEVICE_TRITON_PID:-}" i
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 120; i++)); do
        [[ -z $(_dse_group_pids "$pid") ]] && break
        sleep 0.5
    done
    if [[ -n $(_dse_group_pids "$pid") ]]; then
        _dse_say "tritonserver group $pid still has processes 60 s after SIGTERM: SIGKILL: $(_dse_group_pids "$pid" | tr '\n' ' ')"
        kill -KILL -- "-$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    unset DEVICE_TRITON_PID
    _dse_say "tritonserver stopped"
}

# device_triton_selftest: a throwaway python-backend model that reports the
# stub's Python (version, prefix, numpy, torch, CUDA), through tritonserver and
# tritonclient.grpc. Ports: the configured ones + 100.
device_triton_selftest() {
    _dse_cfg
    local repo="$TRITON_BUNDLE_DIR/selftest_repo" rc
    mkdir -p "$repo/probe/1"
    cat > "$repo/probe/config.pbtxt" <<'EOF'
name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
EOF
    cat > "$repo/probe/1/model.py" <<'EOF'
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        info = {"python": sys.version.split()[0], "prefix": sys.prefix, "numpy": np.__version__}
        try:
            import torch
            info["torch"] = torch.__version__
            info["cuda"] = torch.cuda.is_available()
            if info["cuda"]:
                info["gpu"] = torch.cuda.get_device_name(0)
                info["matmul_ok"] = bool((torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")).sum().item() == 64 ** 3)
        except Exception as e:
            info["torch_error"] = f"{type(e).__name__}: {e}"
        self.info = json.dumps(info)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2),
            pb_utils.Tensor("INFO", np.array([self.info.encode()], dtype=np.object_))]) for r in requests]
EOF
    (
        TRITON_HTTP_PORT=$((TRITON_HTTP_PORT + 100)) TRITON_GRPC_PORT=$((TRITON_GRPC_PORT + 100))
        TRITON_METRICS_PORT=$((TRITON_METRICS_PORT + 100)) DEVICE_TRITON_LOG="$TRITON_BUNDLE_DIR/selftest.log"
        DEVICE_TRITON_READY_TIMEOUT=180
        device_triton_start "$repo" || exit 1
        rc=0
        python3 - "127.0.0.1:$TRITON_GRPC_PORT" <<'EOF' || rc=$?
import sys
import numpy as np
import tritonclient.grpc as g
c = g.InferenceServerClient(sys.argv[1])
x = g.InferInput("X", [3], "FP32"); x.set_data_from_numpy(np.arange(3, dtype=np.float32))
r = c.infer("probe", [x])
try:
    y = r.as_numpy("Y")
except ValueError as e:  # an empty output tensor does not reshape
    y = e
if not isinstance(y, np.ndarray) or y.tolist() != [0.0, 2.0, 4.0]:
    sys.exit(f"[device_env] selftest FAILED: Y = {y!r} (empty outputs: the stub runs under numpy 2, see DEVICE_NUMPY1)")
print("[device_env] selftest OK: stub says", r.as_numpy("INFO")[0].decode(), file=sys.stderr)
EOF
        device_triton_stop
        exit $rc
    )
}

if device_env_export; then
    [[ ${DEVICE_ENV_QUIET:-0} == 1 ]] || device_env_report
    if device_env_ok; then
        [[ ${DEVICE_ENV_QUIET:-0} == 1 ]] || _dse_say "ready: TRITONSERVER_BIN=$TRITONSERVER_BIN TRITON_BACKEND_DIR=$TRITON_BACKEND_DIR"
    else
        _dse_say "NOT READY: unresolved libraries (the 'not found' lines above)"
    fi
else
    _dse_say "NOT READY: setup failed (above)"
fi
