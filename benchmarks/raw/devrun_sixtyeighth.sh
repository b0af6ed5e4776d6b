#!/usr/bin/env bash
# The sixty-eighth session's device calls (kept as benchmarks/raw/devrun_sixtyeighth.sh), the scripts as run:
# call N = devrun/callN.sh, calls 2-4 with .cache/device_bundle carried.

# ===== devrun/call1.sh
# Call 1: GPU correctness on this code: every GPU test file in its own pytest process, side by side,
# and gpu_check.py's decoder and VAE checks beside them.
set -u
t0=$SECONDS
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
echo "[gpu] checkpoint at ${SECONDS}s"
timeout 520 python3 benchmarks/gpu_check.py --checkpoint /tmp/full --timestep-buckets 10,100 \
    --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1 &
files="engine_gpu persistent_layer vae_kernels torch_calls_per_row five_kernel_layer fp8 fp8_model
       local_attention_triton lora_kernel noise skinny_gemm small_mlp split_k triton_attention"
for f in $files; do
    timeout 520 python3 -m pytest -q -p no:cacheprovider "tests/test_$f.py" > "$OUT/gpu_tests_$f.txt" 2>&1 &
done
wait
echo "[gpu] all done at ${SECONDS}s"
for f in $files; do echo "$f: $(tail -1 "$OUT/gpu_tests_$f.txt")"; done
grep -E "FAILED|ERROR" "$OUT"/gpu_tests_*.txt | cut -c1-300 | head -40
tail -12 "$OUT/gpu_check.log"
nvidia-smi --query-gpu=name --format=csv,noheader

# ===== devrun/call2.sh
# Call 2: the closing sweep on this code, burst and Poisson arrivals at 1-128 streams (the fifty-fifth
# session's command), then the engine alone at batch 64 (twice) and 1 in the same call.
set -u
t_end=$((SECONDS + 585))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/served"; mkdir -p "$dir"
left=$((t_end - SECONDS - 110))
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst,poisson \
    LEVELS=1,8,32,64,96,128 REQUESTS=2 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT" "$dir/run.log" | tail -20
gzip -f "$dir/tritonserver.log" 2>/dev/null
left=$((t_end - SECONDS))
if (( left > 60 )); then
    timeout "$left" python3 benchmarks/bench.py --checkpoint /tmp/full --timestep-buckets 10,100 --reference none \
        --no-vae --graphs-only --no-profile --batches 64,64,1 --out "$OUT/offline.json" > "$OUT/offline.log" 2>&1
    echo "[gpu] engine exit $? at ${SECONDS}s"; tail -5 "$OUT/offline.log"
fi
nvidia-smi --query-gpu=name --format=csv,noheader

# ===== devrun/call3.sh
# Call 3: playback_margin_ms 150 against the default 100 on this code, 64 and 128 streams at once:
# three servers one after another (150, 100, 150), each LEVELS=64,128,128,128 REQUESTS=3.
set -u
t_end=$((SECONDS + 590))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
i=0
for margin in 150 100 150; do
    i=$((i + 1)); dir="$OUT/s${i}_m${margin}"; mkdir -p "$dir"
    left=$((t_end - SECONDS - 5))
    (( left > 90 )) || { echo "[gpu] no time for server $i"; break; }
    env OUT="$dir" SET="decoder.timestep_buckets=10,100 decoder.playback_margin_ms=$margin" ARRIVALS=burst \
        LEVELS=64,128,128,128 REQUESTS=3 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
    echo "[gpu] server $i (margin $margin) exit $? at ${SECONDS}s"
    grep -E "ready after" "$dir/run.log" | tail -1
    grep -A6 "^| conc" "$dir/run.log" | grep "^| [0-9]"
    gzip -f "$dir/tritonserver.log" 2>/dev/null
done
nvidia-smi --query-gpu=name --format=csv,noheader

# ===== devrun/call4.sh
# Call 4: the same as call 3 in the other order (100, 150, 100).

set -u
t_end=$((SECONDS + 570))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
i=0
for margin in 100 150 100; do
    i=$((i + 1)); dir="$OUT/s${i}_m${margin}"; mkdir -p "$dir"
    left=$((t_end - SECONDS - 5))
    (( left > 90 )) || { echo "[gpu] no time for server $i"; break; }
    env OUT="$dir" SET="decoder.timestep_buckets=10,100 decoder.playback_margin_ms=$margin" ARRIVALS=burst \
        LEVELS=64,128,128,128 REQUESTS=3 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
    echo "[gpu] server $i (margin $margin) exit $? at ${SECONDS}s"
    grep -E "ready after" "$dir/run.log" | tail -1
    grep -A6 "^| conc" "$dir/run.log" | grep "^| [0-9]"
    gzip -f "$dir/tritonserver.log" 2>/dev/null
done
tar -C "$OUT" -czf "$OUT/servers.tgz" s1_m100 s2_m150 s3_m100 && rm -rf "$OUT"/s[123]_m*
nvidia-smi --query-gpu=name --format=csv,noheader
