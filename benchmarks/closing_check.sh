#!/usr/bin/env bash
# The GPU check a change is closed with (the device tool runs it from the repo root), in two parts
# that each fit one device call of 10 minutes:
#   bash benchmarks/closing_check.sh tests    the test files that take the GPU where there is one
#       (GPU_TESTS below: those that ask for CUDA, and two whose CPU runs in CI cannot show the GPU's
#       behaviour, torch_calls_per_row and audio_vae), each in its own pytest process, side by side,
#       and benchmarks/gpu_check.py beside them, on the full-size random checkpoint: $OUT/tests.tgz
#       (t/gpu_tests_<file>.txt, t/gpu_check.{json,log}: one file, as the device tool brings back at most
#       eight). TEST_TIMEOUT (450 s a file).
#       test_audio_vae.py runs only where the official voxcpm package is installed.
#       GPU_TESTS: other files (names without test_ and .py).
#   bash benchmarks/closing_check.sh served   the served benchmark under the supervisor (run_served_gpu.sh
#       with DRAIN: 1 and 64 streams at once, then SIGTERM with 4 long streams in flight) and what the
#       server left in /tmp and /dev/shm before and after: $OUT/served.tgz (run.log, served.json,
#       drain.json, tritonserver.log.gz). Carry .cache/device_bundle. SERVED_BUDGET (500 s).
# CKPT (/tmp/full): the checkpoint, made if missing.
# Prints the summary lines a results section quotes; exits 1 when a test file, gpu_check or the
# served run fails.
set -uo pipefail
OUT="${OUT:-benchmarks/out}"
# Keep in step with the tests that need CUDA (tests/test_closing_check.py checks it).
GPU_TESTS="${GPU_TESTS:-engine_gpu persistent_layer vae_kernels torch_calls_per_row five_kernel_layer fp8 fp8_model
           local_attention_triton lora_kernel noise skinny_gemm small_mlp split_k triton_attention audio_vae}"
CKPT="${CKPT:-/tmp/full}"

checkpoint() {
    [[ -f $CKPT/config.json ]] || python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json \
        --out "$CKPT" --device cuda 2>&1 | tail -1
    [[ -f $CKPT/config.json ]] || { echo "[closing] no checkpoint at $CKPT"; exit 1; }
    echo "[closing] checkpoint at ${SECONDS}s"
}

gpu_tests() {
    local t="$OUT/t" files="" f i code rc=0
    rm -rf "$t" && mkdir -p "$t"
    for f in $GPU_TESTS; do
        if [[ $f == audio_vae ]] && ! python3 -c "import importlib.util as u; exit(not u.find_spec('voxcpm'))"; then
            echo "[closing] test_audio_vae.py left out: the official voxcpm package is not installed here"
            continue
        fi
        files+=" $f"
    done
    timeout "${TEST_TIMEOUT:-450}" python3 benchmarks/gpu_check.py --checkpoint "$CKPT" --timestep-buckets 10,100 \
        --out "$t/gpu_check.json" > "$t/gpu_check.log" 2>&1 &
    local pids=($!) names=(gpu_check)
    for f in $files; do
        timeout "${TEST_TIMEOUT:-450}" python3 -m pytest -q -p no:cacheprovider "tests/test_$f.py" \
            > "$t/gpu_tests_$f.txt" 2>&1 &
        pids+=($!) names+=("$f")
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"
        code=$?
        ((code == 0)) || { rc=1; echo "[closing] ${names[$i]} failed (exit $code)"; }
    done
    echo "[closing] all done at ${SECONDS}s"
    for f in $files; do echo "$f: $(tail -1 "$t/gpu_tests_$f.txt")"; done
    for f in $files; do grep -E "FAILED|ERROR" "$t/gpu_tests_$f.txt"; done | cut -c1-300 | head -40
    tail -12 "$t/gpu_check.log"
    tar -C "$OUT" -czf "$OUT/tests.tgz" t && rm -rf "$t"
    return $rc
}

served() {
    local dir="$OUT/served" t_end=$((SECONDS + ${SERVED_BUDGET:-500})) rc
    ls -d /tmp/voxcpm-* /tmp/python_env_* /tmp/pymp-* 2>/dev/null | sed 's/^/[before] /'
    ls /dev/shm | grep -c triton_python_backend | sed 's/^/[before] shm regions: /'
    mkdir -p "$dir"
    env OUT="$dir" CKPT="$CKPT" SET="decoder.timestep_buckets=10,100" ARRIVALS=burst LEVELS=1,64 REQUESTS=2 DRAIN=4 \
        timeout $((t_end - SECONDS - 20)) bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
    rc=$?
    echo "[closing] served exit $rc at ${SECONDS}s"
    grep -E "ready after|x-RT|drain|error" "$dir/run.log" | tail -24
    grep -A6 "^| conc" "$dir/run.log" | head -10
    grep -E "^\[supervise" "$dir/tritonserver.log" | head -30
    grep -cE "Exit timeout expired|Signal \(6\)|Fatal Python" "$dir/tritonserver.log" \
        | sed 's/^/[log] exit-timeout, abort or fatal lines: /'
    [[ -f $dir/drain.json ]] && echo "drain.json $(tr -s ' \n' ' ' < "$dir/drain.json" | head -c 1500)"
    sleep 2
    ls -d /tmp/voxcpm-* /tmp/python_env_* /tmp/pymp-* 2>/dev/null | sed 's/^/[after] /'
    ls /dev/shm | grep -c triton_python_backend | sed 's/^/[after] shm regions: /'
    date -u
    gzip -f "$dir/tritonserver.log" 2>/dev/null
    tar -C "$OUT" -czf "$OUT/served.tgz" served && rm -rf "$dir"
    [[ $rc == 0 ]]
}

case "${1:-}" in
    tests) checkpoint; gpu_tests; rc=$? ;;
    served) checkpoint; served; rc=$? ;;
    *) echo "usage: bash benchmarks/closing_check.sh tests|served" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=name --format=csv,noheader
exit $rc
