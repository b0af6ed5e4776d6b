"""The experimental streamed-weights layer (benchmarks/experiments/streamed_weights.py, Gluon, not used
by the server): no CPU interpreter runs Gluon, so this checks that it still builds for Hopper with the
project's triton (TMA into a shared-memory ring, warpgroup MMA, a warp-specialised producer, the
grid barrier's release add) and fits one program's shared memory, and that its PyTorch reference
chains the phases as the kernel does. Its numerics against PyTorch are checked on the GPU by the
script itself (benchmarks/results.md, fifty-third session)."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")
BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
sys.path.insert(0, BENCHMARKS)

from experiments import streamed_weights as sw  # noqa: E402

SMEM_LIMIT = 227 * 1024  # bytes a Hopper program can have
# The compile runs in a process of its own, without TRITON_INTERPRET, as tests/test_persistent_layer_sm90.py's
# do: the interpreter patches triton.language process-wide while any thread runs a kernel, so a compile in
# the test process can be handed the interpreter's builder (a CI run failed so once).
COMPILE = """import json, sys
sys.path.insert(0, sys.argv[1])
from experiments import streamed_weights as sw
k = sw.compile_sm90(24, sys.argv[2] == "True")
json.dump({"ptx": k.asm["ptx"], "shared": k.metadata.shared}, sys.stdout)
"""


@pytest.mark.parametrize("coupled", [False, True])
def test_it_builds_for_hopper_with_a_producer_warp_streaming_tiles(coupled):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    run = subprocess.run([sys.executable, "-c", COMPILE, BENCHMARKS, str(coupled)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    k = json.loads(run.stdout)
    ptx = k["ptx"]
    assert ".target sm_90a" in ptx
    assert "cp.async.bulk.tensor.2d" in ptx and "wgmma.mma_async" in ptx
    assert "mbarrier.try_wait.parity" in ptx and "setmaxnreg" in ptx  # the producer's warps apart
    assert "atom.global.gpu.release.add" in ptx  # the grid barrier's arrival
    assert k["shared"] <= SMEM_LIMIT


def test_the_reference_chains_each_phase_onto_the_last():
    s = sw.Setup.__new__(sw.Setup)  # the reference alone, on the CPU
    table, s.items_per_layer = sw.phase_table()
    s.table, s.layers = table, 1
    assert [t[2] for t in table] == [160, 128, 512, 256] and s.items_per_layer == 1056
    g = torch.Generator().manual_seed(0)
    s.w = torch.randn(s.items_per_layer * 64, sw.BK, generator=g).to(torch.bfloat16)
    s.x = torch.randn(sw.ROWS, sw.TILE_K, generator=g).to(torch.bfloat16)
    got = s.reference()
    # by hand: the down phase's item 5 adds the gate/up phase's item 5, which added the output phase's
    # item 5 % 128, which added QKV's item 5
    xt = s.x.float().T
    want = 0
    for k, n, items, first in table:
        w = s.w[(first + 5) * 64:(first + 6) * 64].float().view(64, sw.TILES, sw.TILE_K)
        want = want + torch.einsum("nts,sr->nr", w, xt)
    torch.testing.assert_close(got[5], want, rtol=1e-5, atol=1e-4)
