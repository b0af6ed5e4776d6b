# shellcheck shell=bash
# The one place that knows how to run the PyPI `tritonserver` (nvidia-pytriton)
# with this project's virtual environment.
#
#   source scripts/triton_env.sh      # defines the functions and exports the
#                                     # environment (PATH, LD_LIBRARY_PATH, ...)
#   bash scripts/triton_env.sh        # prints that environment as KEY=VALUE
#                                     # lines (tests/server.py reads them)
#   bash scripts/triton_env.sh CMD... # runs CMD in it (e.g. perf_analyzer)
#
# Inputs (environment):
#   VENV                 virtual environment (default: $REPO/.venv)
#   TRITON_BACKEND_DIR   backend directory we own (default: $REPO/.triton/backends)
#
# Exports after `triton_env_export` (called on source):
#   REPO VENV TRITON_SITE_PACKAGES TRITON_PYTRITON_DIR TRITONSERVER_BIN
#   TRITON_BACKEND_DIR PERF_ANALYZER_BIN PATH LD_LIBRARY_PATH PYTHONPATH
#   VOXCPM_PYTHON_BACKEND
#
# Facts this encodes:
#  * the python backend runs `<backend dir>/python/triton_python_backend_stub`;
#    the wheel ships one stub per Python version, so we copy the right one
#    next to libtriton_python.so in a directory we own;
#  * the stub's RPATH ($ORIGIN/../../../../nvidia_pytriton.libs) does not hold
#    once copied, so the wheel's nvidia_pytriton.libs goes on LD_LIBRARY_PATH;
#  * the stub embeds Debian's libpython3.11 and takes sys.prefix from the
#    first `python3` on PATH: the venv's bin/ must come first on PATH;
#  * perf_analyzer (tritonclient 2.51.0 wheel, installed in $VENV/bin) needs
#    libb64.so.0d (Debian libb64-0d) and libcudart.so.12 (PyPI
#    nvidia-cuda-runtime-cu12, its lib/ on LD_LIBRARY_PATH).

_triton_env_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="${REPO:-$(cd "$_triton_env_here/.." && pwd)}"
VENV="${VENV:-$REPO/.venv}"
TRITON_BACKEND_DIR="${TRITON_BACKEND_DIR:-$REPO/.triton/backends}"

# Python version of the venv ("3.11"), without starting Python.
triton_venv_pyver() {
    local cfg="$VENV/pyvenv.cfg" v
    if [[ -f $cfg ]]; then
        v="$(sed -n 's/^version\(_info\)\? *= *\([0-9]*\.[0-9]*\).*/\2/p' "$cfg" | head -n1)"
        [[ -n $v ]] && { echo "$v"; return 0; }
    fi
    "$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
}

triton_env_export() {
    local pyver
    pyver="$(triton_venv_pyver)" || return 1
    TRITON_PYVER="$pyver"
    TRITON_SITE_PACKAGES="$VENV/lib/python$pyver/site-packages"
    TRITON_PYTRITON_DIR="$TRITON_SITE_PACKAGES/pytriton/tritonserver"
    TRITONSERVER_BIN="$TRITON_PYTRITON_DIR/bin/tritonserver"
    PERF_ANALYZER_BIN="$VENV/bin/perf_analyzer"
    local libs="$TRITON_SITE_PACKAGES/nvidia_pytriton.libs"
    local cudart="$TRITON_SITE_PACKAGES/nvidia/cuda_runtime/lib"
    # venv first: the stub's Python and the models' imports come from it.
    PATH="$VENV/bin${PATH:+:$PATH}"
    LD_LIBRARY_PATH="$libs:$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # The models import the project's package (python_backend/voxcpm_triton).
    # The stub's embedded Python IGNORES PYTHONPATH: each model.py puts
    # $VOXCPM_PYTHON_BACKEND (or ../../../python_backend) on sys.path itself.
    # PYTHONPATH is still set for tools run with this environment.
    VOXCPM_PYTHON_BACKEND="${VOXCPM_PYTHON_BACKEND:-$REPO/python_backend}"
    PYTHONPATH="$REPO/python_backend${PYTHONPATH:+:$PYTHONPATH}"
    # a stray PYTHONHOME would point the stub's embedded Python elsewhere
    unset PYTHONHOME
    export REPO VENV TRITON_PYVER TRITON_SITE_PACKAGES TRITON_PYTRITON_DIR \
        TRITONSERVER_BIN PERF_ANALYZER_BIN TRITON_BACKEND_DIR PATH \
        LD_LIBRARY_PATH PYTHONPATH VOXCPM_PYTHON_BACKEND
}

# Build (or refresh) $TRITON_BACKEND_DIR/python from the venv's pytriton wheel:
# libtriton_python.so + triton_python_backend_utils.py + the stub for the venv's
# Python. Atomic (build aside, then rename) and a no-op when already current.
triton_build_backend_dir() {
    local src="$TRITON_PYTRITON_DIR" dst="$TRITON_BACKEND_DIR/python"
    local stub="$src/python_backend_stubs/$TRITON_PYVER/triton_python_backend_stub"
    local f
    if [[ ! -x $TRITONSERVER_BIN || ! -f $stub ]]; then
        echo "triton_env: no tritonserver / stub for Python $TRITON_PYVER under $src" >&2
        echo "triton_env: run scripts/setup.sh (VENV=$VENV)" >&2
        return 1
    fi
    if [[ -d $dst ]] \
        && cmp -s "$stub" "$dst/triton_python_backend_stub" \
        && cmp -s "$src/backends/python/libtriton_python.so" "$dst/libtriton_python.so" \
        && cmp -s "$src/backends/python/triton_python_backend_utils.py" "$dst/triton_python_backend_utils.py"; then
        return 0
    fi
    mkdir -p "$TRITON_BACKEND_DIR"
    local tmp
    tmp="$(mktemp -d "$TRITON_BACKEND_DIR/.python.XXXXXX")"
    for f in libtriton_python.so triton_python_backend_utils.py; do
        cp "$src/backends/python/$f" "$tmp/$f"
    done
    cp "$stub" "$tmp/triton_python_backend_stub"
    chmod 755 "$tmp" "$tmp/triton_python_backend_stub"
    if [[ -d $dst ]]; then
        local old="$TRITON_BACKEND_DIR/.python.old.$$"
        mv "$dst" "$old" && mv "$tmp" "$dst" && rm -rf "$old"
    else
        mv "$tmp" "$dst"
    fi
    echo "triton_env: backend dir ready: $dst (stub for Python $TRITON_PYVER)"
}

# True when the venv has what serving needs (cheap check, no Python started).
triton_env_ready() {
    [[ -x $VENV/bin/python3 && -x $TRITONSERVER_BIN \
        && -x $TRITON_BACKEND_DIR/python/triton_python_backend_stub ]]
}

_triton_env_print() {
    local k
    for k in REPO VENV TRITON_PYVER TRITON_SITE_PACKAGES TRITON_PYTRITON_DIR \
        TRITONSERVER_BIN PERF_ANALYZER_BIN TRITON_BACKEND_DIR PATH \
        LD_LIBRARY_PATH PYTHONPATH VOXCPM_PYTHON_BACKEND; do
        printf '%s=%s\n' "$k" "${!k}"
    done
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    # Executed, not sourced: print the environment for other tools.
    set -euo pipefail
    if [[ ! -e $VENV/pyvenv.cfg && ! -x $VENV/bin/python ]]; then
        echo "triton_env: no virtual environment at $VENV (run scripts/setup.sh)" >&2
        exit 1
    fi
    triton_env_export
    if (($#)); then
        # bash scripts/triton_env.sh [--] CMD ARGS...: run CMD in that environment,
        # e.g. bash scripts/triton_env.sh perf_analyzer -m tts -u 127.0.0.1:8000 ...
        [[ $1 == -- ]] && shift
        exec "$@"
    fi
    _triton_env_print
else
    if [[ -e $VENV/pyvenv.cfg || -x $VENV/bin/python ]]; then
        triton_env_export
    fi
fi
