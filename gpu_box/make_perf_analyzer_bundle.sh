#!/usr/bin/env bash
# Build, on this (CPU, networked) machine, a compressed perf_analyzer 2.51 for a GPU box that has
# Python + torch but no tritonclient binaries, no libb64 and no network. It travels as an ignored
# path (carry ".cache/perf_analyzer_bundle"); benchmarks/run_served_gpu.sh (PERF_ANALYZER=1)
# unpacks and runs it there.
#
#   gpu_box/make_perf_analyzer_bundle.sh [OUTDIR]   # default $REPO/.cache/perf_analyzer_bundle
#   -> OUTDIR/perf_analyzer.tar.xz (+ .sha256, MANIFEST.txt)
#
# Contents (top directory perf_analyzer/):
#   bin/perf_analyzer        launcher: puts lib/ first on LD_LIBRARY_PATH, adds fallback/<soname>
#                            only for the libraries the box cannot resolve itself, execs the binary
#   libexec/perf_analyzer    the binary of the tritonclient 2.51.0 manylinux wheel (stripped)
#   lib/                     libb64.so.0d (Debian libb64-0d, this machine's) and libcudart.so.12
#                            (nvidia-cuda-runtime-cu12 wheel): what a bare box lacks for sure
#   fallback/<soname>/       this machine's libssl.so.3, libcrypto.so.3, libz.so.1: used only where
#                            the box has none (the box's own are preferred)
#   MANIFEST.txt
# Not bundled: glibc, libstdc++, libgcc_s (the box's Python and torch need them already; the binary
# needs glibc >= 2.34 and GLIBCXX_3.4.30, i.e. Ubuntu 22.04 or newer).
#
# Environment:
#   VENV            python used for pip (default $REPO/.venv, else python3)
#   WHEEL_CACHE     where downloaded wheels are kept ($REPO/.cache/wheels)
#   CUDART_VERSION  nvidia-cuda-runtime-cu12 version (default 12.9.79)
#   STRIP=0         do not strip
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${1:-$REPO/.cache/perf_analyzer_bundle}"
WHEEL_CACHE="${WHEEL_CACHE:-$REPO/.cache/wheels}"
STRIP="${STRIP:-1}"
TRITONCLIENT_VERSION=2.51.0
CUDART_VERSION="${CUDART_VERSION:-12.9.79}"
LIMIT_MIB=16
REQUIRED=(libb64.so.0d libcudart.so.12)
FALLBACK=(libssl.so.3 libcrypto.so.3 libz.so.1)
# the box's own: never shipped (a foreign glibc or libstdc++ breaks more than it fixes)
SYSTEM_RE='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so'

say() { echo "[pa_bundle] $*" >&2; }
die() { echo "[pa_bundle] ERROR: $*" >&2; exit 1; }

PY="${VENV:-$REPO/.venv}/bin/python3"
[[ -x $PY ]] || PY="$(command -v python3)" || die "no python3 for pip"
for tool in readelf ldd strip tar xz unzip sha256sum; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install binutils xz-utils unzip)"
done

mkdir -p "$WHEEL_CACHE" "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/pa-bundle-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# --- wheels -------------------------------------------------------------------
wheel() {  # wheel GLOB REQUIREMENT PLATFORM...: cached or downloaded
    local glob="$1" req="$2" f p args=()
    shift 2
    for p in "$@"; do args+=(--platform "$p"); done
    f="$(ls -t "$WHEEL_CACHE"/$glob 2>/dev/null | head -n1 || true)"
    if [[ -z $f ]]; then
        say "downloading $req"
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp "${args[@]}" -d "$WHEEL_CACHE" "$req" \
            2> >(grep -v "^WARNING: Location" >&2) || die "pip download $req failed"
        f="$(ls -t "$WHEEL_CACHE"/$glob 2>/dev/null | head -n1 || true)"
        [[ -n $f ]] || die "no $glob after downloading $req"
    fi
    echo "$f"
}
TC_WHL="$(wheel "tritonclient-$TRITONCLIENT_VERSION-py3-none-manylinux*_x86_64.whl" \
    "tritonclient==$TRITONCLIENT_VERSION" manylinux1_x86_64)"
CUDART_WHL="$(wheel "nvidia_cuda_runtime_cu12-$CUDART_VERSION-*manylinux*x86_64.whl" \
    "nvidia-cuda-runtime-cu12==$CUDART_VERSION" manylinux2014_x86_64 manylinux_2_17_x86_64)"
say "wheels: $(basename "$TC_WHL") $(basename "$CUDART_WHL")"

# --- stage --------------------------------------------------------------------
B="$WORK/perf_analyzer"
mkdir -p "$B"/{bin,libexec,lib,fallback} "$WORK/tc" "$WORK/cudart"
unzip -q -j "$TC_WHL" '*.data/data/bin/perf_analyzer' -d "$WORK/tc" || die "no perf_analyzer in $(basename "$TC_WHL")"
head -c4 "$WORK/tc/perf_analyzer" | grep -q $'\x7fELF' || die "the wheel's perf_analyzer is not an ELF binary"
cp "$WORK/tc/perf_analyzer" "$B/libexec/perf_analyzer"
unzip -q -j "$CUDART_WHL" 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$WORK/cudart"
cp "$WORK/cudart/libcudart.so.12" "$B/lib/"

# Every NEEDED entry is either shipped or the box's own: a new dependency stops the build.
needed="$(readelf -d "$B/libexec/perf_analyzer" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
for n in $needed; do
    [[ " ${REQUIRED[*]} ${FALLBACK[*]} " == *" $n "* || $n =~ $SYSTEM_RE ]] \
        || die "perf_analyzer needs $n, which is neither bundled nor a base system library: add it"
done
# where this machine resolves them (cudart from the staged copy)
resolved="$(LD_LIBRARY_PATH="$B/lib" ldd "$B/libexec/perf_analyzer")"
resolve() { awk -v n="$1" '$1 == n && $2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$resolved"; }
for n in "${REQUIRED[@]}"; do
    [[ -f $B/lib/$n ]] && continue
    p="$(resolve "$n")"
    [[ -n $p ]] || die "$n not found on this machine (libb64.so.0d: apt-get install libb64-0d)"
    cp -L "$p" "$B/lib/$n"
done
for n in "${FALLBACK[@]}"; do
    p="$(resolve "$n")"
    [[ -n $p ]] || die "$n not found on this machine"
    mkdir -p "$B/fallback/$n"
    cp -L "$p" "$B/fallback/$n/$n"
done

cat > "$B/bin/perf_analyzer" <<'EOF'
#!/bin/sh
# perf_analyzer 2.51 from gpu_box/make_perf_analyzer_bundle.sh: lib/ first on the library path,
# and fallback/<soname> only for a library the box cannot resolve on its own.
root="$(dirname -- "$(dirname -- "$(readlink -f -- "$0")")")"
exe="$root/libexec/perf_analyzer"
LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for n in $(LD_LIBRARY_PATH="$LD_LIBRARY_PATH" ldd "$exe" 2>/dev/null | awk '$2 == "=>" && $3 == "not" { print $1 }'); do
    [ -d "$root/fallback/$n" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$root/fallback/$n"
done
export LD_LIBRARY_PATH
exec "$exe" "$@"
EOF
chmod 755 "$B/bin/perf_analyzer" "$B/libexec/perf_analyzer"

if [[ $STRIP == 1 ]]; then
    while IFS= read -r -d '' f; do
        strip --strip-unneeded "$f" || die "strip $f failed"
    done < <(find "$B/libexec" "$B/lib" "$B/fallback" -type f -print0)
fi

# --- check: the launcher runs with nothing from the venv, and with fallback/ forced first (as on
# a box without those libraries: they must load too)
for forced in "" "$(printf "$B/fallback/%s:" "${FALLBACK[@]}")"; do
    out="$(env -i PATH=/usr/bin:/bin ${forced:+LD_LIBRARY_PATH="$forced"} "$B/bin/perf_analyzer" --version 2>&1)" \
        || die "perf_analyzer --version failed${forced:+ (fallback/ forced)}: $out"
    grep -q "Perf Analyzer Version" <<<"$out" || die "unexpected --version output: $out"
done
miss="$(LD_LIBRARY_PATH="$B/lib" ldd "$B/libexec/perf_analyzer" | grep "not found" || true)"
[[ -z $miss ]] || die "unresolved with lib/ alone: $miss"
say "runs: $(grep -m1 "Perf Analyzer Version" <<<"$out")"

# --- manifest + tar -------------------------------------------------------------
{
    echo "perf_analyzer bundle built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
    echo "tritonclient $TRITONCLIENT_VERSION: $(basename "$TC_WHL") sha256 $(sha256sum "$TC_WHL" | cut -d' ' -f1)"
    echo "cudart: $(basename "$CUDART_WHL")"
    echo "libb64: $(resolve libb64.so.0d) (libb64-0d $(dpkg-query -W -f='${Version}' libb64-0d 2>/dev/null || echo '?'))"
    echo "fallback (this machine's): ${FALLBACK[*]}"
    echo "stripped: $STRIP"
    echo "NEEDED: $(echo $needed)"
    echo "needs: $(objdump -T "$B/libexec/perf_analyzer" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*\|GLIBCXX_3\.[0-9.]*' \
        | sort -V -u | awk -F_ '{v[$1]=$0} END {print v["GLIBC"], v["GLIBCXX"]}')"
    echo "$out" | grep -m1 "Perf Analyzer Version"
    echo "--- files (bytes, path) ---"
    (cd "$B" && find . -type f -printf '%s %p\n' | sort -k2)
} > "$B/MANIFEST.txt"

TAR="$OUTDIR/perf_analyzer.tar.xz"
XZ_OPT="-9e" tar -C "$WORK" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -cJf "$TAR.tmp" perf_analyzer
mv "$TAR.tmp" "$TAR"
cp "$B/MANIFEST.txt" "$OUTDIR/MANIFEST.txt"
(cd "$OUTDIR" && sha256sum perf_analyzer.tar.xz > perf_analyzer.tar.xz.sha256)

bytes="$(stat -c %s "$TAR")"
say "unpacked $(du -sh "$B" | cut -f1)"
echo "$TAR $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB)"
((bytes <= LIMIT_MIB * 1048576)) || die "bundle is over the ${LIMIT_MIB} MiB limit"
