#!/usr/bin/env bash
# The eighty-ninth session's device calls (2026-12-07, both on 40573dc, one NVIDIA H100 80GB HBM3 lent for an
# nvidia-h200 call, after sixteen refused or untried calls between 22:41 and 23:29 UTC): the committed closing
# check, its served part first on the fresh machine (the eighty-eighth session had served after its GPU tests),
# then the GPU test files in two parts to fit the device time left.
SERVED_BUDGET=320 bash benchmarks/closing_check.sh served                  # 23:31 UTC, carry .cache/device_bundle
GPU_TESTS="engine_gpu fp8_model torch_calls_per_row" TEST_TIMEOUT=220 \
    bash benchmarks/closing_check.sh tests                                  # the same call: 476 s in all
GPU_TESTS="persistent_layer vae_kernels five_kernel_layer fp8 local_attention_triton lora_kernel noise skinny_gemm
           small_mlp split_k triton_attention" TEST_TIMEOUT=330 \
    bash benchmarks/closing_check.sh tests                                  # 23:39 UTC, no carry; 286 s
