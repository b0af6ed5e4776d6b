"""The persistent layer kernel compiled for Hopper (sm_90) on this machine, no GPU needed
(benchmarks/kernel_sm90_mma.py): the swapped products reach the warpgroup MMA that `Launch.swap` is for,
and the L2 prefetches of `Launch.prefetch` compile in."""

import os
import re
import subprocess
import sys

from tests.conftest import require_module
from tests.server import REPO

require_module("triton", "requirements-test.txt")


def compiled(tokens: int, *changes: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    cmd = [sys.executable, str(REPO / "benchmarks" / "kernel_sm90_mma.py"), "--tokens", str(tokens)]
    for c in changes:
        cmd += ["--launch", c]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    m = re.search(r"'SWAP': (\w+), .*\}: wgmma (\d+), mma.sync (\d+), L2 prefetches (\d+), shared memory", run.stdout)
    assert m, run.stdout
    return {"swap": m[1] == "True", "wgmma": int(m[2]), "mma_sync": int(m[3]), "prefetches": int(m[4])}


def test_swapped_products_take_the_warpgroup_mma_below_64_token_rows():
    plain = compiled(22)  # LocDiT at one request: 32-row token tiles, too few for wgmma
    swapped = compiled(22, "swap=True", "prefetch=2")  # as choose_launch launches it on Hopper (balance: no-op)
    assert (plain["swap"], swapped["swap"]) == (False, True)
    assert plain["wgmma"] == 0 and plain["mma_sync"] > 0
    assert swapped["wgmma"] > 0  # gate/up's stacked 2 x 32 weight rows
    assert swapped["mma_sync"] < plain["mma_sync"]
    # a chained layer asks L2 ahead of its output, gate/up (gate and up rows) and down phases
    assert plain["prefetches"] == 0 and swapped["prefetches"] == 4
