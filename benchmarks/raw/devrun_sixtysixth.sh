#!/usr/bin/env bash
# This session's driver (kept as benchmarks/raw/devrun_sixtysixth.sh): servers one after another in
# the order given. Arm "bN": this checkout with decoder.audio_round_patches=N. Arm "new": this checkout;
# "old": the python_backend of devrun/old.tgz (the code before the GIL change: made with
# `git archive e70b860 python_backend model_repository | gzip`) through VOXCPM_PYTHON_BACKEND.
# Call 1 ran "b0 b256" on 4412af2 (audio_round_patches, since removed), call 2 "b0 b0" with TIMELINE=1
# LEVELS=128,128,128 on e70b860, call 3 "new old" with TIMELINE=1 LEVELS=1,64,128,128,128 on 53282da.
# LEVELS=${LEVELS:-1,8,64,128,128} REQUESTS=${REQUESTS:-3} bursts; each server's files tarred into $OUT.
# TIMELINE=1: the server's processes record VOXCPM_TIMELINE there.
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
    set_extra="" server_env="${TIMELINE:+VOXCPM_TIMELINE=$dir/timeline}"
    case $arm in
    b*) set_extra="decoder.audio_round_patches=${arm#b}" ;;
    old) mkdir -p /tmp/old && tar -xzf devrun/old.tgz -C /tmp/old
         server_env="$server_env VOXCPM_PYTHON_BACKEND=/tmp/old/python_backend" ;;
    esac
    env OUT="$dir" SERVER_ENV="$server_env" SET="$FAST $set_extra" ARRIVALS=burst LEVELS="${LEVELS:-1,8,64,128,128}" \
        REQUESTS="${REQUESTS:-3}" timeout "$left" bash benchmarks/run_served_gpu.sh > "$dir/run.log" 2>&1
    echo "[gpu] $arm exit $? at ${SECONDS}s"
    grep -E "ready after|level|x real|smooth" "$dir/run.log" | tail -12
    gzip -f "$dir/tritonserver.log" 2>/dev/null
    tar -C "$(dirname "$dir")" -czf "$ALL/${arm}_$i.tgz" "$(basename "$dir")"
done
nvidia-smi --query-gpu=name --format=csv,noheader
