#!/usr/bin/env bash
# Everything measured on the GPU machine, in one go (the device tool runs it from the repo root):
#   full-size random checkpoint -> Triton-kernel tests -> GPU correctness -> offline benchmark.
# Missing Python packages (pydantic for the reference, voxcpm itself) travel as wheels in .whl/.
# Results land in $OUT (the device tool's output folder) or benchmarks/out.
set -uo pipefail
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
t0=$SECONDS
[[ -f /tmp/full/config.json ]] || python3 scripts/make_tiny_checkpoint.py --config benchmarks/voxcpm2_config.json \
    --out /tmp/full --device cuda 2>&1 | tail -3
echo "[run_gpu] checkpoint ready after $((SECONDS - t0)) s"
ATTN=triton
python3 -m pytest -q -p no:cacheprovider tests/test_triton_attention.py >"$OUT/triton_attention_tests.txt" 2>&1 || ATTN=torch
tail -3 "$OUT/triton_attention_tests.txt"; echo "[run_gpu] decode attention: $ATTN"
python3 benchmarks/kernel_paged_attention.py 2>&1 | tail -12 | tee "$OUT/triton_attention_bench.txt"
[[ ${SKIP_CHECK:-0} == 1 ]] || python3 benchmarks/gpu_check.py --checkpoint /tmp/full --out "$OUT/gpu_check.json" 2>&1 \
    | grep -v "it/s" | tail -8
python3 benchmarks/bench.py --checkpoint /tmp/full --out "$OUT/offline.json" --reference "${REFERENCE:-eager}" --attention "$ATTN" \
    ${BENCH_ARGS:-} 2>&1 | grep -v "it/s\]" | tail -40
echo "[run_gpu] done after $((SECONDS - t0)) s"
