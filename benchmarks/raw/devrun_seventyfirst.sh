#!/usr/bin/env bash
# The seventy-first session's device calls (kept as benchmarks/raw/devrun_seventyfirst.sh), the scripts as run:
# call N = devrun/callN.sh, calls 2-3 with .cache/device_bundle carried. Call 3's first try was cut off when the
# machine was taken back, and a second start was refused; the call below is its third try.

# ===== devrun/call1.sh
# Call 1: GPU correctness on 5168409 (the seventieth session's final code): every GPU test file in its own pytest process,
# side by side, and gpu_check.py's decoder and VAE checks beside them (the sixty-eighth session's call 1).
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
echo "[gpu] checkpoint at ${SECONDS}s"
mkdir -p "$OUT/t"
timeout 520 python3 benchmarks/gpu_check.py --checkpoint /tmp/full --timestep-buckets 10,100 \
    --out "$OUT/t/gpu_check.json" > "$OUT/t/gpu_check.log" 2>&1 &
files="engine_gpu persistent_layer vae_kernels torch_calls_per_row five_kernel_layer fp8 fp8_model
       local_attention_triton lora_kernel noise skinny_gemm small_mlp split_k triton_attention"
for f in $files; do
    timeout 520 python3 -m pytest -q -p no:cacheprovider "tests/test_$f.py" > "$OUT/t/gpu_tests_$f.txt" 2>&1 &
done
wait
echo "[gpu] all done at ${SECONDS}s"
for f in $files; do echo "$f: $(tail -1 "$OUT/t/gpu_tests_$f.txt")"; done
grep -E "FAILED|ERROR" "$OUT"/t/gpu_tests_*.txt | cut -c1-300 | head -40
tail -12 "$OUT/t/gpu_check.log"
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call1.tgz" t && rm -rf "$OUT/t"


# ===== devrun/call2.sh
# Call 2: the served path on 5168409, all at once at 1, 8, 64 and 128 streams
# (REQUESTS=2, the closing sweep's command without Poisson arrivals), then the engine alone at batch
# 64 (twice) and 1 in the same call.
set -u
t_end=$((SECONDS + 585))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/served"; mkdir -p "$dir"
left=$((t_end - SECONDS - 110))
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst \
    LEVELS=1,8,64,128 REQUESTS=2 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT" "$dir/run.log" | tail -20
grep -A8 "^| conc" "$dir/run.log" | head -12
gzip -f "$dir/tritonserver.log" 2>/dev/null
left=$((t_end - SECONDS))
if (( left > 60 )); then
    timeout "$left" python3 benchmarks/bench.py --checkpoint /tmp/full --timestep-buckets 10,100 --reference none \
        --no-vae --graphs-only --no-profile --batches 64,64,1 --out "$OUT/offline.json" > "$OUT/offline.log" 2>&1
    echo "[gpu] engine exit $? at ${SECONDS}s"; tail -5 "$OUT/offline.log"
fi
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call2.tgz" served offline.json offline.log 2>/dev/null; rm -rf "$OUT/served"


# ===== devrun/call3.sh
# Call 3: Poisson arrivals at 1-128 streams on 8fcae23 (5168409 and a LoRA load check no level runs; the sixty-eighth session's closing sweep without
# its burst half and engine runs, which call 2 made; a first try was cut off when the machine was taken back).
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/sweep"; mkdir -p "$dir"
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=poisson \
    LEVELS=1,8,32,64,96,128 REQUESTS=2 timeout 440 bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT|capacity" "$dir/run.log" | tail -20
grep "^| [0-9]" "$dir/run.log"
gzip -f "$dir/tritonserver.log" 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call3.tgz" sweep && rm -rf "$dir"
