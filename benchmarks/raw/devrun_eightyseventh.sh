#!/usr/bin/env bash
# The eighty-seventh session's device calls (2026-12-07, NVIDIA H100 80GB HBM3, both on d748d2c, one warm machine,
# after seven refused tries between 15:39 and 16:11 UTC): first devrun/call2.sh (16:20 UTC, carry .cache/device_bundle
# and .cache/gateway_wheels, unchanged since the eighty-fifth session), then devrun/call1.sh (16:27 UTC, no carry; its
# per-file timeouts cut from 450 to 360 s, `sed -i 's/timeout 450/timeout 360/g'` in the call, to fit the budget left).
# The eighty-sixth session's calls, test_audio_vae.py left out of call 1 (the device has no official voxcpm package).

# ===== devrun/call1.sh
# Call 1 (eighty-seventh session): GPU correctness after this session's moves (gpu/ out of engine/, audio/patches.py):
# every GPU test file in its own pytest process, side by side, and gpu_check.py beside them (the eighty-sixth's call 1).
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
# Call 2 (eighty-seventh session): this session's code served under scripts/supervise.py on the GPU, as the
# eighty-sixth session's call 2: 1 and 64 streams at once, then SIGTERM with 4 long streams in flight;
# the supervisor's lines; what is left in /tmp and /dev/shm.
set -u
t_end=$((SECONDS + 500))
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



