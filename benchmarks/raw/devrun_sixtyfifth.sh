#!/usr/bin/env bash
# This session's driver (kept as benchmarks/raw/devrun_sixtyfifth.sh): servers one after another in
# the order given, each the same code with decoder.audio_channel=true ("chan") or false ("resp"),
# LEVELS=${LEVELS:-1,8,64,128,128} REQUESTS=${REQUESTS:-3} bursts; each server's files tarred into $OUT.
set -u
ALL="$OUT"
t_end=$((SECONDS + ${BUDGET_S:-575}))
FAST="decoder.timestep_buckets=10,100"
python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json --out /tmp/full --device cuda 2>&1 | tail -1
i=0
for arm in "$@"; do
    i=$((i + 1))
    dir="$(mktemp -d)/${arm}_$i"; mkdir -p "$dir"
    left=$((t_end - SECONDS))
    (( left > 120 )) || { echo "[gpu] no time left for $arm"; break; }
    case $arm in
    chan) ch=true ;;
    resp) ch=false ;;
    esac
    env OUT="$dir" SET="$FAST decoder.audio_channel=$ch" ARRIVALS=burst LEVELS="${LEVELS:-1,8,64,128,128}" \
        REQUESTS="${REQUESTS:-3}" timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
    echo "[gpu] $arm exit $? at ${SECONDS}s"
    grep -E "ready after|level|x real|smooth" "$dir/run.log" | tail -12
    gzip -f "$dir/tritonserver.log" 2>/dev/null
    tar -C "$(dirname "$dir")" -czf "$ALL/${arm}_$i.tgz" "$(basename "$dir")"
done
nvidia-smi --query-gpu=name --format=csv,noheader
