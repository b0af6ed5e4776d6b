#!/usr/bin/env bash
# The eighty-fifth session's device calls (2026-12-07, NVIDIA H100 80GB HBM3; calls 1 and 2 on fa00851, the code that
# landed at stop 92): call 1 = devrun/call1.sh (08:35 UTC, no carry), call 2 = devrun/call2.sh (08:42 UTC,
# carry .cache/device_bundle and .cache/gateway_wheels, rebuilt here by gpu_box/make_*.sh). The eighty-second
# session's calls, unchanged. Call 3 = devrun/call3.sh (09:35 UTC, on 1cdd910, the same carry): the guard after
# a SIGKILLed supervisor, then call 2 again on this session's code. Call 4 = devrun/call4.sh (09:47 UTC, on
# 89dcbc9): call 3's part A again.

# ===== devrun/call1.sh
# Call 1 (eighty-second session): GPU correctness on this session's code: every GPU test file in its own pytest
# process, side by side, and gpu_check.py's decoder and VAE checks beside them (the sixty-ninth session's call 1).
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
echo "[gpu] checkpoint at ${SECONDS}s"
mkdir -p "$OUT/t"
timeout 450 python3 benchmarks/gpu_check.py --checkpoint /tmp/full --timestep-buckets 10,100 \
    --out "$OUT/t/gpu_check.json" > "$OUT/t/gpu_check.log" 2>&1 &
files="engine_gpu persistent_layer vae_kernels torch_calls_per_row five_kernel_layer fp8 fp8_model
       local_attention_triton lora_kernel noise skinny_gemm small_mlp split_k triton_attention"
for f in $files; do
    timeout 450 python3 -m pytest -q -p no:cacheprovider "tests/test_$f.py" > "$OUT/t/gpu_tests_$f.txt" 2>&1 &
done
wait
echo "[gpu] all done at ${SECONDS}s"
for f in $files; do echo "$f: $(tail -1 "$OUT/t/gpu_tests_$f.txt")"; done
grep -E "FAILED|ERROR" "$OUT"/t/gpu_tests_*.txt | cut -c1-300 | head -40
tail -12 "$OUT/t/gpu_check.log"
nvidia-smi --query-gpu=name --format=csv,noheader


# ===== devrun/call2.sh
# Call 2 (eighty-second session): this session's code served under scripts/supervise.py on the GPU, as the
# eighty-first session's call 1: 1 and 64 streams at once, then SIGTERM with 4 long streams in flight (the
# drain); the supervisor's lines; what is left in /tmp and /dev/shm.
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
tar -C "$OUT" -czf "$OUT/call2.tgz" served && rm -rf "$dir"



# ===== devrun/call3.sh
# Call 3 (eighty-fifth session): this session's code on the GPU. Part A: the supervisor SIGKILLed while the
# full-size models load (40 s in), its guard (scripts/server_guard.py) then ends what the server left.
# Part B: served 1 and 64 streams under the supervisor, then the drain (the eighty-second session's call 2).
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
(
DEVICE_ENV_QUIET=1 source gpu_box/device_serve_env.sh
device_env_ok || echo "[guard] environment incomplete"
mkdir -p "$OUT/guard"
echo "[guard] shm regions before: $(ls /dev/shm | grep -c triton_python_backend)"
VOXCPM_PROBE_INTERVAL=0 VOXCPM_CHECKPOINT=/tmp/full setsid python3 scripts/supervise.py -- "$TRITONSERVER_BIN" \
    --model-repository="$PWD/model_repository" --backend-directory="$TRITON_BACKEND_DIR" \
    --http-address=127.0.0.1 --http-port=18000 --grpc-address=127.0.0.1 --grpc-port=18001 \
    --metrics-address=127.0.0.1 --metrics-port=18002 --allow-metrics=true --exit-timeout-secs=10 \
    > "$OUT/guard/supervise.log" 2>&1 < /dev/null &
sup=$!
sleep 40
echo "[guard] at the kill (40 s): stubs $(pgrep -fc triton_python_backend_stub), tritonserver $(pgrep -fc bin/tritonserver), guards $(pgrep -fc server_guard.py)"
kill -9 "$sup"
for t in 5 10 15 20 25 30 35; do
    sleep 5
    echo "[guard] ${t} s after: stubs $(pgrep -fc triton_python_backend_stub), tritonserver $(pgrep -fc bin/tritonserver), guards $(pgrep -fc server_guard.py)"
done
ps -eo pid,ppid,stat,etimes,args | grep -E "triton_python_backend_stub|bin/tritonserver|server_guard" | grep -v grep | cut -c1-160
grep -E "guard|Non-graceful|Fatal" "$OUT/guard/supervise.log" | head -12
echo "[guard] shm regions after: $(ls /dev/shm | grep -c triton_python_backend)"
pkill -9 -f triton_python_backend_stub; pkill -9 -f bin/tritonserver; sleep 1
rm -f /dev/shm/triton_python_backend_shm_region_*
)
# eighty-first session's call 1: 1 and 64 streams at once, then SIGTERM with 4 long streams in flight (the
# drain); the supervisor's lines; what is left in /tmp and /dev/shm.
set -u
t_end=$((SECONDS + 420))

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
tar -C "$OUT" -czf "$OUT/call2.tgz" served && rm -rf "$dir"


# ===== devrun/call4.sh
# Call 4 (eighty-fifth session): call 3's part A again on 89dcbc9: the guard now also removes the killed
# supervisor's state directory and the shared-memory regions recorded there.
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
(
DEVICE_ENV_QUIET=1 source gpu_box/device_serve_env.sh
device_env_ok || echo "[guard] environment incomplete"
mkdir -p "$OUT/guard"
echo "[guard] shm regions before: $(ls /dev/shm | grep -c triton_python_backend)"; ls -d /tmp/voxcpm-run-* 2>/dev/null | sed "s/^/[guard] left: /"
VOXCPM_PROBE_INTERVAL=0 VOXCPM_CHECKPOINT=/tmp/full setsid python3 scripts/supervise.py -- "$TRITONSERVER_BIN" \
    --model-repository="$PWD/model_repository" --backend-directory="$TRITON_BACKEND_DIR" \
    --http-address=127.0.0.1 --http-port=18000 --grpc-address=127.0.0.1 --grpc-port=18001 \
    --metrics-address=127.0.0.1 --metrics-port=18002 --allow-metrics=true --exit-timeout-secs=10 \
    > "$OUT/guard/supervise.log" 2>&1 < /dev/null &
sup=$!
sleep 40
echo "[guard] at the kill (40 s): stubs $(pgrep -fc triton_python_backend_stub), tritonserver $(pgrep -fc bin/tritonserver), guards $(pgrep -fc server_guard.py)"
kill -9 "$sup"
for t in 5 10 15 20 25; do
    sleep 5
    echo "[guard] ${t} s after: stubs $(pgrep -fc triton_python_backend_stub), tritonserver $(pgrep -fc bin/tritonserver), guards $(pgrep -fc server_guard.py)"
done
ps -eo pid,ppid,stat,etimes,args | grep -E "triton_python_backend_stub|bin/tritonserver|server_guard" | grep -v grep | cut -c1-160
grep -E "guard|Non-graceful|Fatal" "$OUT/guard/supervise.log" | head -12
echo "[guard] shm regions after: $(ls /dev/shm | grep -c triton_python_backend)"; ls -d /tmp/voxcpm-run-* 2>/dev/null | sed "s/^/[guard] left: /"
pkill -9 -f triton_python_backend_stub; pkill -9 -f bin/tritonserver; sleep 1
rm -f /dev/shm/triton_python_backend_shm_region_*
)
