#!/usr/bin/env bash
# The seventy-ninth session's device calls (kept as benchmarks/raw/devrun_seventyninth.sh), as run on one H100 on
# f7da7fc's tree plus the uncommitted GW_SOURCES loop of benchmarks/run_served_gpu.sh (committed after), with
# devrun/old/gateway = `git archive 197bab6 gateway`; .cache/device_bundle and .cache/gateway_wheels carried.

# ===== devrun/call1.sh
# Call 1: the gateway before this session (197bab6: uvicorn's httptools protocol) against this
# session's (h11, the 64 KiB head bound, the shutdown drain), one server, alternating old/new/old/new:
# time to first byte at one stream and the aggregate at 64, each against the direct gRPC stream.
set -u
t_end=$((SECONDS + 590))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/gw"; mkdir -p "$dir"
env OUT="$dir" SET="decoder.timestep_buckets=10,100" GATEWAY=1 GW_STREAMS=64 GW_REQUESTS=20 \
    GW_SOURCES=devrun/old/gateway,gateway,devrun/old/gateway,gateway \
    timeout $((t_end - SECONDS - 15)) bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] exit $? at ${SECONDS}s"
grep -E "ready after|run_served_gpu\] gateway|Traceback|rror" "$dir/run.log" | tail -20
python3 - "$dir" <<'PY'
import json, sys, os, glob
for p in sorted(glob.glob(os.path.join(sys.argv[1], "gateway_*.json"))):
    d = json.load(open(p))
    s, c = d["single"], d["concurrent"]
    print(os.path.basename(p), "ttfb p50 direct %.2f gw %.2f" % (s["direct"]["ttfb_ms"]["p50"], s["gateway_pcm"]["ttfb_ms"]["p50"]),
          "| 64: direct %.1fx gw %.1fx errors %d/%d" % (c["direct"]["x_real_time"], c["gateway"]["x_real_time"],
                                                       c["direct"]["errors"], c["gateway"]["errors"]))
PY
nvidia-smi --query-gpu=name --format=csv,noheader
gzip -f "$dir/tritonserver.log" 2>/dev/null

# ===== devrun/call2.sh (on the same machine, right after)
# Call 2: the seventy-ninth session's final code on the GPU, served the way serve.sh serves it: under
# scripts/supervise.py (DRAIN: its state-directory lock passed to tritonserver), the OpenAI gateway (with
# its h11 protocol) at 64 streams, then 1 and 64 streams all at once, then the drain on
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
tar -C "$OUT" -czf "$OUT/call2.tgz" served && rm -rf "$dir"

