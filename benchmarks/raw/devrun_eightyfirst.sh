#!/usr/bin/env bash
# The eighty-first session's device calls (kept as benchmarks/raw/devrun_eightyfirst.sh), on one H100, tree 6cc5f1d
# (call 2, the held stop on the GPU with benchmarks/held_stop.py --environ, below, was tried 4 times: no machine came); .cache/device_bundle and .cache/gateway_wheels carried.

# ===== devrun/call1.sh
# Call 1 (eighty-first session): this session's code served under scripts/supervise.py on the GPU (the
# supervisor's new held check is on: a repository of the product's models), 1 and 64 streams at once, then
# SIGTERM with 4 long streams in flight (the drain); the supervisor's lines; what is left in /tmp and /dev/shm.
set -u
t_end=$((SECONDS + 590))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
ls -d /tmp/voxcpm-* /tmp/python_env_* /tmp/pymp-* 2>/dev/null | sed 's/^/[before] /'
ls /dev/shm | grep -c triton_python_backend | sed 's/^/[before] shm regions: /'
dir="$OUT/served"; mkdir -p "$dir"
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst LEVELS=1,64 REQUESTS=2 DRAIN=4 \
    timeout $((t_end - SECONDS - 20)) bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT|drain|error" "$dir/run.log" | tail -24
grep -A6 "^| conc" "$dir/run.log" | head -10
grep -E "^\[supervise" "$dir/tritonserver.log" | head -30
grep -cE "Exit timeout expired|Signal \(6\)|Fatal Python" "$dir/tritonserver.log" | sed 's/^/[log] exit-timeout, abort or fatal lines: /'
python3 - "$dir" <<'PY'
import json, sys, os
p = os.path.join(sys.argv[1], "drain.json")
if os.path.exists(p):
    print("drain.json", json.dumps(json.load(open(p)))[:1500])
PY
sleep 2
ls -d /tmp/voxcpm-* /tmp/python_env_* /tmp/pymp-* 2>/dev/null | sed 's/^/[after] /'
ls /dev/shm | grep -c triton_python_backend | sed 's/^/[after] shm regions: /'
nvidia-smi --query-gpu=name --format=csv,noheader
date -u
gzip -f "$dir/tritonserver.log" 2>/dev/null
tar -C "$OUT" -czf "$OUT/call1.tgz" served && rm -rf "$dir"

# ===== devrun/call2.sh (not run)
# Call 2 (eighty-first session): the held stop on the GPU: benchmarks/held_stop.py --environ (scripts/supervise.py
# over the bundle's tritonserver, exit timeout 30 s, the full-size random checkpoint), each run 50 rounds of 4
# tts_stream streams cancelled right after their final responses, then SIGTERM.
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
DEVICE_ENV_QUIET=1 source gpu_box/device_serve_env.sh
mkdir -p "$OUT/hs"
timeout 540 python3 benchmarks/held_stop.py --environ --checkpoint /tmp/full --runs 2 --rounds 50 --logs "$OUT/hs" \
    | tee "$OUT/held_stop.jsonl"
echo "[gpu] held_stop exit ${PIPESTATUS[0]} at ${SECONDS}s"
for f in "$OUT"/hs/serve_*.log; do echo "== $f"; grep -E "^\[supervise" "$f" | tail -6; done
ls -d /tmp/voxcpm-* /tmp/python_env_* 2>/dev/null | sed 's/^/[after] /'
ls /dev/shm | grep -c triton_python_backend | sed 's/^/[after] shm regions: /'
nvidia-smi --query-gpu=name --format=csv,noheader
date -u
gzip -f "$OUT"/hs/serve_*.log 2>/dev/null
tar -C "$OUT" -czf "$OUT/call2.tgz" hs && rm -rf "$OUT/hs"
