#!/usr/bin/env bash
# The seventy-seventh session's device calls (kept as benchmarks/raw/devrun_seventyseventh.sh), the scripts as run on an
# H100: call N = devrun/callN.sh, calls 2-5 with .cache/device_bundle carried. Call 1 ran on bc33ecb's tree, call 2's
# first try on 335d0e7 (the server did not load: raw/served_c2_first_try_failed_seventyseventh.txt), calls 2-4
# on that tree with 4ee3dc1's one-line import fix.

# ===== devrun/call1.sh
# Call 1: GPU correctness on 014c329 (the seventy-sixth session's final code): every GPU test file in its own
# pytest process, side by side, and gpu_check.py's decoder and VAE checks beside them.
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
echo "[gpu] checkpoint at ${SECONDS}s"
mkdir -p "$OUT/t"
timeout 520 python3 benchmarks/gpu_check.py --checkpoint /tmp/full --timestep-buckets 10,100 \
    --out "$OUT/t/gpu_check.json" > "$OUT/t/gpu_check.log" 2>&1 &
files="engine_gpu persistent_layer persistent_layer_sm90 vae_kernels torch_calls_per_row five_kernel_layer fp8 fp8_model
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
# Call 2: the served path on this code, all at once at 1, 8 and 64 streams (REQUESTS=3), then the engine
# alone at batch 64 (twice) and 1 in the same call: served over engine at 64 streams.
set -u
t_end=$((SECONDS + 585))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/served"; mkdir -p "$dir"
left=$((t_end - SECONDS - 110))
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst \
    LEVELS=1,8,64 REQUESTS=3 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
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
# Call 3: the default repository as shipped (every decode graph bucket): its cold start timed, then
# all at once at 1 and 64 streams (REQUESTS=2).
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/default"; mkdir -p "$dir"
env OUT="$dir" ARRIVALS=burst LEVELS=1,64 REQUESTS=2 timeout 560 bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT" "$dir/run.log" | tail -20
grep -A6 "^| conc" "$dir/run.log" | head -10
gzip -f "$dir/tritonserver.log" 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call3.tgz" default && rm -rf "$dir"

# ===== devrun/call4.sh
# Call 4: the default repository as shipped, truly cold: the inductor and Triton kernel caches removed
# first (call 3 found them warm from call 2 on the same machine), then one stream.
set -u
rm -rf /tmp/torchinductor_* ~/.triton/cache ~/.cache/torch/inductor 2>/dev/null
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/cold"; mkdir -p "$dir"
env OUT="$dir" ARRIVALS=burst LEVELS=1 REQUESTS=2 timeout 560 bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT" "$dir/run.log" | tail -5
gzip -f "$dir/tritonserver.log" 2>/dev/null
zcat "$dir/tritonserver.log.gz" | grep -E "ready in|captured" | cut -c1-400
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call4.tgz" cold && rm -rf "$dir"

# ===== devrun/call5.sh (on 8ee0b26, a fresh machine)
# Call 5: the session's final code (8ee0b26) served on a fresh machine: all at once at 1 and 64 streams
# (REQUESTS=2), the benchmarks' two loop lengths.
set -u
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/final"; mkdir -p "$dir"
env OUT="$dir" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst LEVELS=1,64 REQUESTS=2 \
    timeout 540 bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|x-RT" "$dir/run.log" | tail -6
gzip -f "$dir/tritonserver.log" 2>/dev/null
zcat "$dir/tritonserver.log.gz" | grep -E "ready in|^E[0-9]" | cut -c1-300 | head -8
nvidia-smi --query-gpu=name --format=csv,noheader
tar -C "$OUT" -czf "$OUT/call5.tgz" final && rm -rf "$dir"
