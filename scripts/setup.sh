#!/usr/bin/env bash
# Set up everything needed to serve and test: Debian packages, the virtual
# environment ($VENV, default $REPO/.venv) with the runtime + test requirements,
# and the Triton python backend directory ($TRITON_BACKEND_DIR, default
# $REPO/.triton/backends).
#
# Idempotent and quick when nothing changed: the pip step is skipped when the
# stamp in $VENV matches the hash of the requirements.
#
# Environment:
#   VENV             virtual environment to create/use (default $REPO/.venv)
#   PYTHON           interpreter for a new venv (default /usr/bin/python3.11:
#                    Debian's, whose libpython3.11 the Triton stub embeds)
#   SKIP_APT=1       do not check/install Debian packages
#   FORCE_SETUP=1    ignore the stamp and re-run pip
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$REPO/.venv}"
PYTHON="${PYTHON:-/usr/bin/python3.11}"
# voxcpm's own requirements would pull a CUDA torch, torchaudio and gradio;
# its needs for the parity tests are in requirements-test.txt.
VOXCPM_NODEPS="voxcpm==2.0.3"
APT_PACKAGES=(python3.11 python3.11-venv libpython3.11 libb64-0d docker-compose)

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
t0=$SECONDS

# --- one setup at a time per venv -------------------------------------------
lock="/tmp/voxcpm-setup-$(printf '%s' "$VENV" | sha1sum | cut -c1-12).lock"
exec 9>"$lock"
if ! flock -n 9; then
    log "another setup of $VENV is running; waiting for it"
    flock 9
fi

# --- Debian packages ----------------------------------------------------------
apt_missing() {
    local p st
    for p in "${APT_PACKAGES[@]}"; do
        st="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
        [[ $st == "install ok installed" ]] || printf '%s\n' "$p"
    done
}
if [[ ${SKIP_APT:-0} != 1 ]] && command -v dpkg-query >/dev/null; then
    mapfile -t missing < <(apt_missing)
    if ((${#missing[@]})); then
        log "installing Debian packages: ${missing[*]}"
        SUDO=()
        if [[ $(id -u) != 0 ]]; then
            if ! { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
                die "need root (or passwordless sudo) to apt-get install ${missing[*]}; or set SKIP_APT=1"
            fi
            SUDO=(sudo -n)
        fi
        export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
        "${SUDO[@]}" apt-get update -qq
        "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        log "Debian packages installed"
    else
        log "Debian packages present: ${APT_PACKAGES[*]}"
    fi
fi

# --- virtual environment --------------------------------------------------------
if [[ ! -x $VENV/bin/python ]]; then
    [[ -x $PYTHON ]] || die "$PYTHON not found (Debian package python3.11)"
    log "creating venv $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
home="$(sed -n 's/^home *= *//p' "$VENV/pyvenv.cfg" 2>/dev/null || true)"
if [[ $home != /usr/bin ]]; then
    log "WARNING: $VENV is based on '$home', not Debian's /usr/bin/python3.11;"
    log "WARNING: the Triton stub embeds Debian's libpython3.11 and may not run with it"
fi
pyver="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# --- pip ---------------------------------------------------------------------------
stamp="$VENV/.voxcpm-setup-stamp"
want="$( {
    echo "python=$pyver nodeps=$VOXCPM_NODEPS"
    cat "$REPO/requirements.txt" "$REPO/requirements-test.txt"
} | sha256sum | cut -d' ' -f1)"
have="$(cat "$stamp" 2>/dev/null || true)"
tritonserver="$VENV/lib/python$pyver/site-packages/pytriton/tritonserver/bin/tritonserver"
if [[ ${FORCE_SETUP:-0} == 1 || $want != "$have" || ! -x $tritonserver ]]; then
    rm -f "$stamp"
    log "pip: installing requirements.txt + requirements-test.txt into $VENV (first time: ~1-3 min)"
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
    # one line per package is enough: keep "Installing"/"Successfully"/errors
    PIP_NOISE='^(Requirement already satisfied|Processing |Collecting |Looking in |WARNING: Location .* is ignored| +(Using cached|Downloading|Obtaining|Attempting uninstall|Found existing|Uninstalling|Successfully uninstalled))'
    if ! "${PIP[@]}" install --progress-bar off \
        -r "$REPO/requirements.txt" -r "$REPO/requirements-test.txt" 2>&1 \
        | { grep -v -E "$PIP_NOISE" || true; }; then
        die "pip install failed"
    fi
    log "pip: installing $VOXCPM_NODEPS --no-deps"
    if ! "${PIP[@]}" install --progress-bar off -q --no-deps "$VOXCPM_NODEPS" 2>&1 \
        | { grep -v -E "$PIP_NOISE" || true; }; then
        die "pip install $VOXCPM_NODEPS failed"
    fi
    echo "$want" >"$stamp"
    log "pip: done"
else
    log "pip: requirements unchanged (stamp $stamp)"
fi

# --- perf_analyzer wrapper ----------------------------------------------------------------
# The tritonclient wheel puts the perf_analyzer binary (and perf_client, the same
# binary) in $VENV/bin; it needs libcudart.so.12 from nvidia-cuda-runtime-cu12,
# which is not on the default library path (libb64.so.0d, Debian's libb64-0d, is).
# The binary moves to $VENV/libexec/ and a small script takes its place in bin/
# that puts the venv's cudart on LD_LIBRARY_PATH and execs it, so
# `.venv/bin/perf_analyzer` runs from a plain shell. Runs every time (cheap): a
# pip (re)install that puts the binary back in bin/ is wrapped again here. Each
# step is a rename, so bin/perf_analyzer always runs, even during this step.
PERF_WRAPPER_MARK="voxcpm-perf-analyzer-wrapper"
install_perf_analyzer_wrapper() {
    local name="$1" bin="$VENV/bin/$1" real="$VENV/libexec/$1" tmp
    [[ -e $bin ]] || return 0 # not installed (tritonclient without perf_analyzer)
    if ! LC_ALL=C head -c 256 "$bin" | grep -aq "$PERF_WRAPPER_MARK"; then
        # bin/ holds the real binary (fresh install or pip reinstall): move it aside
        mkdir -p "$VENV/libexec"
        tmp="$(mktemp "$VENV/libexec/.$name.XXXXXX")"
        cp -p "$bin" "$tmp" && chmod 755 "$tmp" && mv -f "$tmp" "$real"
        log "perf_analyzer: $name moved to $real"
    fi
    [[ -x $real ]] || die "$bin is a wrapper but $real is missing: reinstall the binary with
  $VENV/bin/python -m pip install --force-reinstall --no-deps 'tritonclient[all]==<version in requirements.txt>'
and run $0 again"
    tmp="$(mktemp "$VENV/bin/.$name.XXXXXX")"
    cat >"$tmp" <<EOF
#!/bin/sh
# $PERF_WRAPPER_MARK: written by scripts/setup.sh. The real $name is
# ../libexec/$name; it needs libcudart.so.12 (PyPI nvidia-cuda-runtime-cu12).
venv="\$(dirname -- "\$(dirname -- "\$(readlink -f -- "\$0")")")"
cudart="\$venv/lib/python$pyver/site-packages/nvidia/cuda_runtime/lib"
case ":\${LD_LIBRARY_PATH:-}:" in
*":\$cudart:"*) ;;
*) LD_LIBRARY_PATH="\$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" ;;
esac
export LD_LIBRARY_PATH
exec "\$venv/libexec/$name" "\$@"
EOF
    chmod 755 "$tmp"
    if cmp -s "$tmp" "$bin"; then rm -f "$tmp"; else mv -f "$tmp" "$bin"; fi
}
for _pa in perf_analyzer perf_client; do
    install_perf_analyzer_wrapper "$_pa"
done
# as from a plain shell: without LD_LIBRARY_PATH
env -u LD_LIBRARY_PATH "$VENV/bin/perf_analyzer" --version >/dev/null 2>&1 \
    || die "$VENV/bin/perf_analyzer does not run (needs libb64-0d, and libcudart.so.12 from nvidia-cuda-runtime-cu12)"

# --- Triton backend directory -----------------------------------------------------------
# shellcheck source=scripts/triton_env.sh
source "$REPO/scripts/triton_env.sh"
triton_build_backend_dir
{ "$TRITONSERVER_BIN" --help 2>&1 || true; } | grep -q -- --model-repository || die "$TRITONSERVER_BIN does not run (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
"$PERF_ANALYZER_BIN" --version >/dev/null 2>&1 || die "$PERF_ANALYZER_BIN does not run (needs libb64-0d, libcudart.so.12)"

log "ready in $((SECONDS - t0)) s: venv=$VENV python=$pyver backend_dir=$TRITON_BACKEND_DIR"
