"""The engine on a GPU: CUDA graphs and overlapped steps (step N+1 launched before step N is read).

Skipped without CUDA (CI runs on CPU); on the GPU machine it runs with the other GPU tests
(benchmarks/README.md). The CPU tests in test_engine.py check the same engine logic, but there
every step is done before `launch` returns.
"""

import time

import pytest
import torch

from voxcpm_triton import VoxCPM2
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished, LatentChunk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
TIMEOUT = 300


def test_a_graph_captured_while_a_step_is_in_flight_leaves_every_result_in_its_place(checkpoint_dirs):
    """A (10 timesteps), B (30) and C (10, ends first) share bucket 4. When C's last step is in
    flight, A and B move to bucket 2 with 30 timesteps: a graph start-up did not capture, so it is
    captured then. Each step's result must reach its own patch: a launch refilling the host
    buffers of the step not read yet would hand that step the next one's patches (duplicates)."""
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cuda", dtype="bfloat16")
    prompt = vox.prepare_prompt("Graphs on the GPU, captured while serving.")
    eng = Engine(vox, EngineConfig(num_blocks=256, block_size=16, max_batch_size=4, compile=False))
    try:
        started = set(eng.runner.graphs)
        events = {rid: [] for rid in "ABC"}
        specs = {"A": dict(seed=1, min_len=40, max_len=40), "B": dict(seed=2, min_len=40, max_len=40,
                 inference_timesteps=30), "C": dict(seed=3, min_len=6, max_len=6)}
        with eng._lock:  # one admission takes all three (the engine's condition lock is re-entrant)
            for rid, gen in specs.items():
                eng.submit(EngineRequest(rid, prompt, **gen), sink=events[rid].append)
        t0 = time.monotonic()
        while not all(ev and isinstance(ev[-1], Finished) for ev in events.values()):
            assert time.monotonic() - t0 < TIMEOUT
            time.sleep(0.01)
    finally:
        eng.shutdown()
    assert (2, 30, 1) in set(eng.runner.graphs) - started, sorted(eng.runner.graphs)
    for rid, ev in events.items():
        assert ev[-1].error is None, ev[-1]
        lat = torch.cat([e.patches for e in ev if isinstance(e, LatentChunk)])
        assert lat.shape[0] == specs[rid]["max_len"]
        same_as_next = [i for i in range(len(lat) - 1) if torch.equal(lat[i], lat[i + 1])]
        assert not same_as_next, (rid, same_as_next)
