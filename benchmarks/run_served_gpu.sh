#!/usr/bin/env bash
# The served benchmark on the GPU machine (the device tool runs it from the repo root):
# tritonserver from the bundle gpu_box/make_device_bundle.sh built (carry .cache/device_bundle),
# this model repository on the full-size random checkpoint, then benchmarks/bench_served.py.
#   LEVELS (1,8,32,64)  REQUESTS (2 per worker)  CKPT (/tmp/full, made if missing)
#   ARRIVALS (burst; "burst,poisson" runs both, poisson into served_poisson.json)  MEAN_GAP (2 s)
# Writes $OUT/served.json and $OUT/tritonserver.log (benchmarks/out without $OUT).
set -uo pipefail
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
CKPT="${CKPT:-/tmp/full}"
[[ -f $CKPT/config.json ]] || python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json \
    --out "$CKPT" --device cuda 2>&1 | tail -1
DEVICE_ENV_QUIET=1 source gpu_box/device_serve_env.sh
t0=$SECONDS
if ! VOXCPM_CHECKPOINT="$CKPT" DEVICE_TRITON_LOG="$OUT/tritonserver.log" device_triton_start; then
    echo "[run_served_gpu] tritonserver did not start"; exit 1
fi
echo "[run_served_gpu] server ready after $((SECONDS - t0)) s (load, compile, capture)"
grep -E "captured|compiled|start-up|GiB" "$OUT/tritonserver.log" | tail -5
rc=0
IFS=, read -ra modes <<<"${ARRIVALS:-burst}"
for mode in "${modes[@]}"; do
    name=served; [[ $mode == burst ]] || name="served_$mode"
    python3 benchmarks/bench_served.py --url "127.0.0.1:$TRITON_GRPC_PORT" --concurrency "${LEVELS:-1,8,32,64}" \
        --requests-per-worker "${REQUESTS:-2}" --min-length 100 --max-length 100 --warmup 2 \
        --arrivals "$mode" --mean-gap "${MEAN_GAP:-2}" --json-out "$OUT/$name.json" || rc=$?
done
device_triton_stop
echo "[run_served_gpu] done after $((SECONDS - t0)) s"
exit $rc
