#!/usr/bin/env bash
# Build, on this (CPU, networked) machine, a compressed tritonserver bundle for
# a GPU box that has Python 3.12 + torch but no tritonserver and no network.
# The bundle travels with the working tree (it is an ignored path: pass it as
# `carry`), and gpu_box/device_serve_env.sh unpacks and uses it there.
#
#   gpu_box/make_device_bundle.sh [OUTDIR]      # default $REPO/.cache/device_bundle
#   -> OUTDIR/tritonbundle.tar.xz (+ .sha256, MANIFEST.txt)
#
# Contents (top directory tritonbundle/):
#   bin/tritonserver                      nvidia-pytriton 0.7.0 (Triton 2.51)
#   lib/                                  only the nvidia_pytriton.libs that
#                                         tritonserver, the python backend and
#                                         the stub need (NEEDED closure)
#   backends/python/libtriton_python.so, triton_python_backend_utils.py
#   stubs/<X.Y>/triton_python_backend_stub   (default: 3.12 only)
#   caches/local/libtritoncache_local.so
#   python/tritonclient/                  pure-Python tritonclient 2.51.0,
#                                         grpc + utils only (no http, no
#                                         perf_analyzer)
#   pyfallback/                           packaging + python-rapidjson (cp312):
#                                         tritonclient.grpc imports them; the
#                                         device's own win (end of PYTHONPATH)
#   pylib/libpython3.12.so.1.0            last-resort libpython for the stub,
#                                         used only if the device has none
#   numpy1/<X.Y>/                         numpy 1.26.4 (tests dropped): the
#                                         stub of Triton 2.51 is built with a
#                                         pybind11 that predates numpy 2 and
#                                         makes EMPTY output tensors under
#                                         numpy 2.x; device_serve_env.sh gives
#                                         the stub's Python this numpy when the
#                                         device's is 2.x
#   MANIFEST.txt
# ELF files are stripped (--strip-unneeded); tar -cJ with xz -9.
#
# Environment:
#   VENV                 python used for pip (default $REPO/.venv, else python3)
#   WHEEL_CACHE          where downloaded wheels are kept ($REPO/.cache/wheels)
#   BUNDLE_PYVERS        stub versions to include (default "3.12"; add 3.11 to
#                        test the bundle on this machine)
#   LIBPYTHON312         a libpython3.12.so.1.0 to ship as the fallback
#                        (default: searched: pyenv 3.12.x, python3.12's LIBDIR);
#                        LIBPYTHON312=none ships none
#   BUNDLE_NUMPY1=0      do not ship numpy 1.26.4
#   STRIP=0              do not strip
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${1:-$REPO/.cache/device_bundle}"
WHEEL_CACHE="${WHEEL_CACHE:-$REPO/.cache/wheels}"
BUNDLE_PYVERS="${BUNDLE_PYVERS:-3.12}"
STRIP="${STRIP:-1}"
PYTRITON_VERSION=0.7.0
NUMPY1_VERSION=1.26.4
TRITONCLIENT_VERSION=2.51.0
TARGET_MIB=45
LIMIT_MIB=60

say() { echo "[bundle] $*" >&2; }
die() { echo "[bundle] ERROR: $*" >&2; exit 1; }

PY="${VENV:-$REPO/.venv}/bin/python3"
[[ -x $PY ]] || PY="$(command -v python3)" || die "no python3 for pip"
for tool in readelf strip tar xz unzip sha256sum; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install binutils xz-utils unzip)"
done

mkdir -p "$WHEEL_CACHE" "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tritonbundle-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# --- wheels -------------------------------------------------------------------
# pip download: the py3.12 manylinux wheels (pure ones where they exist).
pip_download() {  # pip_download REQUIREMENT... (PYV: python version, default 3.12)
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYV:-3.12}" \
        --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 -d "$WHEEL_CACHE" "$@" 2> >(grep -v "^WARNING: Location" >&2)
}
find_wheel() {  # find_wheel GLOB: newest match in the cache
    local f
    f="$(ls -t "$WHEEL_CACHE"/$1 2>/dev/null | head -n1)"
    [[ -n $f ]] && echo "$f"
}
wheel() {  # wheel GLOB REQUIREMENT: cached or downloaded
    local f
    if ! f="$(find_wheel "$1")"; then
        say "downloading $2"
        pip_download "$2" || die "pip download $2 failed"
        f="$(find_wheel "$1")" || die "no $1 after downloading $2"
    fi
    echo "$f"
}
PYTRITON_WHL="$(wheel "nvidia_pytriton-$PYTRITON_VERSION-*manylinux*_x86_64.whl" "nvidia-pytriton==$PYTRITON_VERSION")"
TC_WHL="$(wheel "tritonclient-$TRITONCLIENT_VERSION-py3-none-any.whl" "tritonclient==$TRITONCLIENT_VERSION")"
PACKAGING_WHL="$(wheel "packaging-*-py3-none-any.whl" "packaging")"
RAPIDJSON_WHL="$(wheel "python_rapidjson-*-cp312-cp312-*x86_64.whl" "python-rapidjson")"
say "wheels: $(basename "$PYTRITON_WHL") $(basename "$TC_WHL") $(basename "$PACKAGING_WHL") $(basename "$RAPIDJSON_WHL")"

NUMPY1_WHLS=()
if [[ ${BUNDLE_NUMPY1:-1} == 1 ]]; then
    for v in $BUNDLE_PYVERS; do
        NUMPY1_WHLS+=("$(PYV=$v wheel "numpy-$NUMPY1_VERSION-cp${v/./}-cp${v/./}-*manylinux*x86_64.whl" "numpy==$NUMPY1_VERSION")")
    done
fi

# --- stage --------------------------------------------------------------------
X="$WORK/wheel"
B="$WORK/tritonbundle"
mkdir -p "$X" "$B"/{bin,lib,backends/python,caches/local,python,pyfallback}
unzip -q "$PYTRITON_WHL" 'pytriton/tritonserver/*' 'nvidia_pytriton.libs/*' -d "$X"
T="$X/pytriton/tritonserver"
L="$X/nvidia_pytriton.libs"
cp "$T/bin/tritonserver" "$B/bin/"
cp "$T/backends/python/libtriton_python.so" "$T/backends/python/triton_python_backend_utils.py" "$B/backends/python/"
cp "$T/caches/local/libtritoncache_local.so" "$B/caches/local/"
for v in $BUNDLE_PYVERS; do
    [[ -f $T/python_backend_stubs/$v/triton_python_backend_stub ]] || die "the wheel has no stub for Python $v"
    mkdir -p "$B/stubs/$v"
    cp "$T/python_backend_stubs/$v/triton_python_backend_stub" "$B/stubs/$v/"
done

# NEEDED closure over the wheel's lib dir: only what is really linked.
roots=("$B/bin/tritonserver" "$B/backends/python/libtriton_python.so" "$B/caches/local/libtritoncache_local.so" "$B"/stubs/*/triton_python_backend_stub)
declare -A seen=()
todo=("${roots[@]}")
while ((${#todo[@]})); do
    f="${todo[-1]}"
    unset 'todo[-1]'
    while read -r n; do
        if [[ -f $L/$n && -z ${seen[$n]:-} ]]; then
            seen[$n]=1
            todo+=("$L/$n")
        fi
    done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done
for n in "${!seen[@]}"; do cp "$L/$n" "$B/lib/"; done
dropped="$(comm -23 <(ls "$L" | sort) <(printf '%s\n' "${!seen[@]}" | sort) | tr '\n' ' ')"
say "libs: ${#seen[@]} of $(ls "$L" | wc -l) kept; dropped (not in the NEEDED closure): ${dropped:-none}"

# tritonclient: grpc + utils (+ the package's top-level modules), no http.
unzip -q "$TC_WHL" -d "$WORK/tc"
tcsrc="$(ls -d "$WORK"/tc/tritonclient-*.data/purelib/tritonclient)"
mkdir -p "$B/python/tritonclient"
cp "$tcsrc"/*.py "$B/python/tritonclient/"
cp -r "$tcsrc/grpc" "$tcsrc/utils" "$B/python/tritonclient/"
find "$B/python" -name __pycache__ -prune -exec rm -rf {} +

# fallback pure/cp312 deps of tritonclient.grpc
for w in "$PACKAGING_WHL" "$RAPIDJSON_WHL"; do unzip -q -o "$w" -d "$B/pyfallback"; done
rm -rf "$B"/pyfallback/*.dist-info "$B"/pyfallback/rapidjson-stubs

# numpy 1.x for the stub's Python (see the header)
for w in "${NUMPY1_WHLS[@]}"; do
    v="$(basename "$w" | sed -n 's/.*-cp3\([0-9]*\)-cp3.*/3.\1/p')"
    mkdir -p "$B/numpy1/$v"
    unzip -q "$w" -d "$B/numpy1/$v"
    find "$B/numpy1/$v" -type d -name tests -prune -exec rm -rf {} +
done

# last-resort libpython3.12 for the stub
lp="${LIBPYTHON312:-}"
if [[ -z $lp ]]; then
    for c in /root/.pyenv/versions/3.12*/lib/libpython3.12.so.1.0 \
        "$(python3.12 -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))' 2>/dev/null)/libpython3.12.so.1.0" \
        /usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0 /usr/local/lib/libpython3.12.so.1.0; do
        [[ -f $c ]] && { lp="$c"; break; }
    done
fi
if [[ -n $lp && $lp != none ]]; then
    [[ -f $lp ]] || die "LIBPYTHON312=$lp: no such file"
    mkdir -p "$B/pylib"
    cp "$lp" "$B/pylib/libpython3.12.so.1.0"
    say "fallback libpython: $lp"
else
    say "WARNING: no libpython3.12.so.1.0 found to ship as a fallback (set LIBPYTHON312=...)"
fi

# strip
if [[ $STRIP == 1 ]]; then
    while IFS= read -r -d '' f; do
        if head -c4 "$f" | grep -q $'\x7fELF'; then
            strip --strip-unneeded "$f" || die "strip $f failed"
        fi
    done < <(find "$B" -type f \( -name '*.so*' -o -name tritonserver -o -name triton_python_backend_stub \) -print0)
fi
chmod 755 "$B/bin/tritonserver" "$B"/stubs/*/triton_python_backend_stub

# --- check: every library resolves from the bundle (+ the system's base libs) --
bad=0
for f in "$B/bin/tritonserver" "$B/backends/python/libtriton_python.so" "$B/caches/local/libtritoncache_local.so" "$B"/stubs/*/triton_python_backend_stub; do
    extra=""
    [[ -d $B/pylib ]] && extra=":$B/pylib"
    miss="$(LD_LIBRARY_PATH="$B/lib$extra" ldd "$f" 2>&1 | grep "not found" | grep -v 'libpython3\.[0-9]*\.so' || true)"
    if [[ -n $miss ]]; then
        say "unresolved for ${f#"$B"/}: $miss"
        bad=1
    fi
done
((bad == 0)) || die "unresolved libraries (above)"

# --- manifest + tar -------------------------------------------------------------
{
    echo "tritonbundle built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "nvidia-pytriton $PYTRITON_VERSION: $(basename "$PYTRITON_WHL") sha256 $(sha256sum "$PYTRITON_WHL" | cut -d' ' -f1)"
    echo "tritonclient $TRITONCLIENT_VERSION: $(basename "$TC_WHL") (grpc + utils only)"
    echo "pyfallback: $(basename "$PACKAGING_WHL") $(basename "$RAPIDJSON_WHL")"
    echo "stubs: $BUNDLE_PYVERS"
    echo "numpy1: $(for w in "${NUMPY1_WHLS[@]}"; do basename "$w"; done | tr '\n' ' ')"
    echo "fallback libpython: ${lp:-none}"
    echo "stripped: $STRIP"
    echo "dropped libs: ${dropped:-none}"
    echo "--- files (bytes, path) ---"
    (cd "$B" && find . -type f ! -path './python/*' ! -path './pyfallback/*' ! -path './numpy1/*' -printf '%s %p\n' | sort -k2)
    echo "--- python files: $(find "$B/python" "$B/pyfallback" -type f | wc -l) (tritonclient, pyfallback); numpy1: $(du -sb "$B/numpy1" 2>/dev/null | cut -f1) bytes"
    echo "--- NEEDED ---"
    for f in "$B/bin/tritonserver" "$B/backends/python/libtriton_python.so" "$B"/stubs/*/triton_python_backend_stub; do
        echo "${f#"$B"/}: $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    done
} > "$B/MANIFEST.txt"

TAR="$OUTDIR/tritonbundle.tar.xz"
say "compressing (xz -9; about a minute)"
XZ_OPT="-9 ${XZ_THREADS:+-T$XZ_THREADS}" tar -C "$WORK" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime=@0 -cJf "$TAR.tmp" tritonbundle
mv "$TAR.tmp" "$TAR"
cp "$B/MANIFEST.txt" "$OUTDIR/MANIFEST.txt"
(cd "$OUTDIR" && sha256sum tritonbundle.tar.xz > tritonbundle.tar.xz.sha256)

bytes="$(stat -c %s "$TAR")"
mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
raw="$(du -sb "$B" | cut -f1)"
say "unpacked $(awk -v b="$raw" 'BEGIN { printf "%.1f", b / 1048576 }') MiB"
echo "$TAR $bytes bytes ($mib MiB)"
if ((bytes > LIMIT_MIB * 1048576)); then
    die "bundle is over the ${LIMIT_MIB} MiB limit"
elif ((bytes > TARGET_MIB * 1048576)); then
    say "WARNING: bundle is over the ${TARGET_MIB} MiB target"
fi
