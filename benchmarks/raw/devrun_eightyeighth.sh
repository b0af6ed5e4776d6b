#!/usr/bin/env bash
# The eighty-eighth session's device calls (2026-12-07, NVIDIA H100 80GB HBM3, all three on 40172a8, one warm
# machine, after twelve refused or untried calls between 18:19 and 19:12 UTC): the committed closing check, which
# this session made out of the devrun scripts the eighty-fifth to eighty-seventh sessions copied, then its served
# part again on the same machine, its budget cut to fit the device time left.
bash benchmarks/closing_check.sh tests                       # 19:15 UTC, no carry; 332 s
SERVED_BUDGET=520 bash benchmarks/closing_check.sh served    # 19:21 UTC, carry .cache/device_bundle; 240 s
SERVED_BUDGET=290 bash benchmarks/closing_check.sh served    # 19:26 UTC, the same; 124 s (compiled kernels cached)
