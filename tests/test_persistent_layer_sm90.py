"""The persistent layer kernel compiled for Hopper (sm_90) on this machine, no GPU needed
(benchmarks/kernel_sm90_mma.py): the swapped products reach the warpgroup MMA that `Launch.swap` is for,
and the L2 prefetches compile in."""

import os
import re
import subprocess
import sys

from tests.server import REPO


def compiled(tokens: int, *changes: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(REPO / "benchmarks" / "kernel_sm90_mma.py"), "--tokens", str(tokens)]
    for c in changes:
        cmd += ["--launch", c]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    m = re.search(r"'SWAP': (\w+), 'PF': (\d+)\}: wgmma (\d+), mma.sync (\d+), shared memory (\d+) B", out)
    assert m, out
    return {"swap": m[1] == "True", "prefetch": int(m[2]), "wgmma": int(m[3]), "mma_sync": int(m[4])}


def test_swapped_products_take_the_warpgroup_mma_below_64_token_rows():
    plain = compiled(22)  # LocDiT at one request: 32-row token tiles, too few for wgmma
    swapped = compiled(22, "swap=True", "prefetch=2")  # as choose_launch launches it on Hopper
    assert (plain["swap"], swapped["swap"], swapped["prefetch"]) == (False, True, 2)
    assert plain["wgmma"] == 0 and plain["mma_sync"] > 0
    assert swapped["wgmma"] > 0  # gate/up's stacked 2 x 32 weight rows
    assert swapped["mma_sync"] < plain["mma_sync"]
