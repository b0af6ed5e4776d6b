#!/usr/bin/env bash
# The sixty-seventh session's device calls (kept as benchmarks/raw/devrun_sixtyseventh.sh), the scripts as run.
# A first try of call1.sh was lost (the machine was taken back). Call 1 = call1.sh; calls 2, 3, 5 and 6 =
# call2.sh, each with the variants results.md names (of a diagnostic copy of the LoRA merge test, since
# deleted; the last version is the one below's loop), call 4 = call3.sh over git archives of 13 commits
# (devrun/bisect/<commit>.tgz), call 7 = call4.sh.

# ===== devrun/call1.sh
# Call 1: GPU correctness on this code (the GPU tests of the engine and gpu_check's decoder checks).
set -u
t_end=$((SECONDS + 570))
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
echo "[gpu] checkpoint at ${SECONDS}s"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py tests/test_torch_calls_per_row.py \
    > "$OUT/gpu_tests.txt" 2>&1
echo "[gpu] tests exit $? at ${SECONDS}s"; tail -3 "$OUT/gpu_tests.txt"
left=$((t_end - SECONDS))
timeout "$left" python3 benchmarks/gpu_check.py --checkpoint /tmp/full --only decoder --timestep-buckets 10,100 \
    --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1
echo "[gpu] gpu_check exit $? at ${SECONDS}s"; tail -8 "$OUT/gpu_check.log"
nvidia-smi --query-gpu=name --format=csv,noheader

# ===== devrun/call2.sh
# Call 2: the LoRA merge test's failure: per-patch errors, variants in parallel processes.
set -u
for v in nofsq fsqdist; do
    timeout 480 python3 -m pytest -q -s -p no:cacheprovider tests/test_zz_diag.py -k "$v" > "$OUT/diag_$v.txt" 2>&1 &
done
wait
for v in nofsq fsqdist; do echo "== $v"; grep -E "DIAG|FSQDIST|SITES|LAUNCHES|STATES|passed|failed|Error" "$OUT/diag_$v.txt" | grep -v LAUNCHES | cut -c1-700; done

# ===== devrun/call3.sh
# Call 3: which commit broke test_one_adapter_merged_on_the_gpu_gives_its_lora_ops_latents: each commit's own test, in parallel.
set -u
for f in devrun/bisect/*.tgz; do
    c=$(basename "$f" .tgz); d=/tmp/bisect/$c; mkdir -p "$d"; tar -xzf "$f" -C "$d"
    (cd "$d" && timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py -k "adapter_merged" > "$OUT/bisect_$c.txt" 2>&1) &
done
wait
for f in devrun/bisect/*.tgz; do c=$(basename "$f" .tgz); echo "$c: $(grep -E "AssertionError: \(|passed|failed|error" "$OUT/bisect_$c.txt" | tr '\n' ' ' | cut -c1-200)"; done

# ===== devrun/call4.sh
# Call 4: the LoRA merge GPU test as fixed; one server on this code with the timeline,
# LEVELS=1,8,64,128,128,128, each level with the clients in one process, then in four;
# then the engine alone at batch 64 if time is left.
set -u
t_end=$((SECONDS + 585))
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine_gpu.py -k adapter_merged > "$OUT/gpu_test_merged.txt" 2>&1
echo "[gpu] merged test exit $? at ${SECONDS}s"; tail -1 "$OUT/gpu_test_merged.txt"
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
dir="$OUT/served"; mkdir -p "$dir"
left=$((t_end - SECONDS - 150))
env OUT="$dir" SERVER_ENV="VOXCPM_TIMELINE=$dir/timeline" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst \
    LEVELS=1,8,64,128,128,128 REQUESTS=3 CLIENT_PROCESSES=1,4 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
echo "[gpu] served exit $? at ${SECONDS}s"
grep -E "ready after|client processes|x-RT" "$dir/run.log" | tail -30
gzip -f "$dir/tritonserver.log" 2>/dev/null
tar -C "$dir" -czf "$OUT/timeline.tgz" timeline && rm -rf "$dir/timeline"
left=$((t_end - SECONDS))
if (( left > 140 )); then
    timeout "$left" python3 benchmarks/bench.py --checkpoint /tmp/full --timestep-buckets 10,100 --reference none \
        --no-vae --graphs-only --no-profile --batches 64,64 --out "$OUT/offline_b64.json" > "$OUT/offline_b64.log" 2>&1
    echo "[gpu] engine exit $? at ${SECONDS}s"; tail -4 "$OUT/offline_b64.log"
fi
nvidia-smi --query-gpu=name --format=csv,noheader
