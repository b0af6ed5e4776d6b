#!/usr/bin/env bash
# The seventy-eighth session's device calls (kept as benchmarks/raw/devrun_seventyeighth.sh), as run on one H100
# on 08067e4's tree, .cache/device_bundle and .cache/gateway_wheels carried: call 1 = devrun/call1.sh, call 2 the
# one-liner after it, on the same machine right after.

# ===== devrun/call1.sh
# Call 1: the seventy-eighth session's final code on the GPU, served the way serve.sh serves it: under
# scripts/supervise.py (DRAIN: its state-directory lock passed to tritonserver), the OpenAI gateway (with
# its per-address connection cap) at 64 streams, then 1 and 64 streams all at once, then the drain on
# SIGTERM; what is left in /tmp and /dev/shm after.
set -u
t_end=$((SECONDS + 590))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
ls -d /tmp/voxcpm-* /tmp/python_env_* /tmp/pymp-* 2>/dev/null | sed 's/^/[before] /'
ls /dev/shm | grep -c triton_python_backend | sed 's/^/[before] shm regions: /'
dir="$OUT/served"; mkdir -p "$dir"
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst LEVELS=1,64 REQUESTS=2 \
    GATEWAY=1 GW_STREAMS=64 DRAIN=4 timeout $((t_end - SECONDS - 20)) bash benchmarks/run_served_gpu.sh \
    > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT|drain|error" "$dir/run.log" | tail -24
grep -A6 "^| conc" "$dir/run.log" | head -10
grep -E "^\[supervise" "$dir/tritonserver.log" | head -20
python3 - "$dir" <<'PY'
import json, sys, os
d = sys.argv[1]
for name in ("gateway.json", "drain.json"):
    p = os.path.join(d, name)
    if os.path.exists(p):
        print(name, json.dumps(json.load(open(p)))[:1500])
PY
sleep 2
ls -d /tmp/voxcpm-* /tmp/python_env_* /tmp/pymp-* 2>/dev/null | sed 's/^/[after] /'
ls /dev/shm | grep -c triton_python_backend | sed 's/^/[after] shm regions: /'
nvidia-smi --query-gpu=name --format=csv,noheader
gzip -f "$dir/tritonserver.log" 2>/dev/null
tar -C "$OUT" -czf "$OUT/call1.tgz" served && rm -rf "$dir"

# ===== call 2
# The engine alone on the same machine: served over engine at 64 streams.
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1; timeout 500 python3 benchmarks/bench.py --checkpoint /tmp/full --timestep-buckets 10,100 --reference none --no-vae --graphs-only --no-profile --batches 64,64,1 --out "$OUT/offline.json" > "$OUT/offline.log" 2>&1; echo "exit $?"; tail -8 "$OUT/offline.log"; nvidia-smi --query-gpu=name --format=csv,noheader
