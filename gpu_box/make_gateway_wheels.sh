#!/usr/bin/env bash
# Wheels of the OpenAI speech API gateway's dependencies (gateway/voxcpm_gateway) for a GPU box
# with Python 3.12 and no network, built here. The box's own numpy and grpcio serve, and the
# device bundle (make_device_bundle.sh) brings tritonclient; this adds the ASGI stack and metrics.
# benchmarks/run_served_gpu.sh (GATEWAY=1) unpacks them onto PYTHONPATH; carry the folder as an
# ignored path ("carry": [".cache/device_bundle", ".cache/gateway_wheels"]).
#
#   gpu_box/make_gateway_wheels.sh [OUTDIR]     # default $REPO/.cache/gateway_wheels
#
# Environment: VENV (python used for pip, default $REPO/.venv), PYV (3.12),
# WITH_AV=1 adds PyAV (~40 MB: mp3/opus/aac; without it those formats answer 500 there).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${1:-$REPO/.cache/gateway_wheels}"
PY="${VENV:-$REPO/.venv}/bin/python3"
[[ -x $PY ]] || PY="$(command -v python3)"
PKGS=(fastapi starlette pydantic anyio "uvicorn>=0.55,<0.56" h11 uvloop python-multipart prometheus-client)
[[ ${WITH_AV:-0} == 1 ]] && PKGS+=(av)
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"
"$PY" -m pip download --quiet --only-binary=:all: --python-version "${PYV:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUTDIR" "${PKGS[@]}" 2> >(grep -v "^WARNING: Location" >&2)
# the box has these (and tritonclient's grpc needs the box's own)
rm -f "$OUTDIR"/numpy-*.whl "$OUTDIR"/grpcio-*.whl "$OUTDIR"/protobuf-*.whl
echo "[gateway_wheels] $(ls "$OUTDIR" | wc -l) wheels, $(du -sh "$OUTDIR" | cut -f1) in $OUTDIR:" >&2
ls "$OUTDIR" >&2
