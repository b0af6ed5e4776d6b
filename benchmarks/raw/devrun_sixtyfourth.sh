#!/usr/bin/env bash
# The sixty-fourth session's driver, run as devrun/gpu.sh from the repository root with the patch
# (shm_forward_prefault_sixtyfourth.patch) applied, and 1ed7a61's code beside it:
#   mkdir -p devrun/base && git archive 1ed7a61 python_backend model_repository | tar -x -C devrun/base
# One device call: servers one after another, in the order given (base, new, prefault, newbig, basebig), each
# LEVELS=128,128 REQUESTS=3 bursts; each server's files tarred into $OUT as soon as it ends.
set -u
ALL="$OUT"
t_end=$((SECONDS + ${BUDGET_S:-570}))
BIG="--backend-config=python,shm-default-byte-size=134217728 --backend-config=python,shm-growth-byte-size=67108864"
FAST="decoder.timestep_buckets=10,100"
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
i=0
for arm in "$@"; do
    i=$((i + 1))
    dir="$(mktemp -d)/${arm}_$i"; mkdir -p "$dir"
    left=$((t_end - SECONDS))
    (( left > 90 )) || { echo "[gpu] no time left for $arm"; break; }
    ( while sleep 2; do n=$(ls /dev/shm | grep -c triton_python); (( n >= 20 )) && ls -l /dev/shm > "$dir/shm_last.txt"; done ) &
    watch=$!
    case $arm in
    base) env OUT="$dir" SET="$FAST" MODEL_REPOSITORY=devrun/base/model_repository \
              SERVER_ENV="VOXCPM_PYTHON_BACKEND=$PWD/devrun/base/python_backend" ARRIVALS=burst LEVELS=128,128 \
              REQUESTS=3 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1 ;;
    basebig) env OUT="$dir" SET="$FAST" MODEL_REPOSITORY=devrun/base/model_repository TRITON_ARGS="$BIG" \
              SERVER_ENV="VOXCPM_PYTHON_BACKEND=$PWD/devrun/base/python_backend" ARRIVALS=burst LEVELS=128,128 \
              REQUESTS=3 timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1 ;;
    newbig) env OUT="$dir" SET="$FAST" TRITON_ARGS="$BIG" ARRIVALS=burst LEVELS=128,128 REQUESTS=3 \
             timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1 ;;
    new) env OUT="$dir" SET="$FAST" ARRIVALS=burst LEVELS=128,128 REQUESTS=3 \
             timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1 ;;
    prefault) env OUT="$dir" SET="$FAST decoder.shm_prefault=true tts_stream.shm_prefault=true" TRITON_ARGS="$BIG" \
                  ARRIVALS=burst LEVELS=128,128 REQUESTS=3 timeout "$left" bash benchmarks/run_served_gpu.sh \
                  > "$dir/run.log" 2>&1 ;;
    esac
    echo "[gpu] $arm exit $? at ${SECONDS}s"
    kill "$watch" 2>/dev/null
    grep -E "ready after|shared memory|level|x real" "$dir/run.log" | tail -8
    grep -h "shared memory" "$dir/tritonserver.log" | head -5
    gzip -f "$dir/tritonserver.log" 2>/dev/null
    tar -C "$(dirname "$dir")" -czf "$ALL/${arm}_$i.tgz" "$(basename "$dir")"
done
nvidia-smi --query-gpu=name --format=csv,noheader
