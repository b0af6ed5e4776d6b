#!/usr/bin/env bash
# The seventy-third session's device call (call 1 = devrun/call1.sh, .cache/device_bundle, .cache/gateway_wheels and devrun carried).
# Call 1: the OpenAI gateway on the GPU beside the served path (3e20cd8: the seventy-second session's final code),
# burst at 1 and 64 streams, then the engine alone at batch 64 (twice) and 1 in the same call.
set -u
t_end=$((SECONDS + 585))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
echo "[gpu] checkpoint at ${SECONDS}s"
dir="$OUT/served"; mkdir -p "$dir"
left=$((t_end - SECONDS - 110))
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst LEVELS=1,64 REQUESTS=2 GATEWAY=1 GW_STREAMS=64 \
    timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT|TTFB|aggregate|gateway" "$dir/run.log" | tail -30
grep -A8 "^| conc" "$dir/run.log" | head -12
gzip -f "$dir/tritonserver.log" 2>/dev/null
left=$((t_end - SECONDS))
if (( left > 60 )); then
    timeout "$left" python3 benchmarks/bench.py --checkpoint /tmp/full --timestep-buckets 10,100 --reference none \
        --no-vae --graphs-only --no-profile --batches 64,64,1 --out "$OUT/offline.json" > "$OUT/offline.log" 2>&1
    echo "[gpu] engine exit $? at ${SECONDS}s"; tail -5 "$OUT/offline.log"
fi
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call1.tgz" served offline.json offline.log 2>/dev/null; rm -rf "$OUT/served"
