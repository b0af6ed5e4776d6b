"""CFG_VALUE scales the guidance in fp32 whatever the model dtype, as the reference's Python float does."""

import pytest
import torch
from torch import nn

from tests.conftest import TINY_CONFIG, write_checkpoint
from voxcpm_triton import VoxCPM2
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished
from voxcpm_triton.model.local_modules import CFMSolver


class FixedVelocity(nn.Module):
    """An estimator that returns preset conditional / unconditional velocities."""

    def __init__(self, v):
        super().__init__()
        self.v = v

    def condition(self, mu, cond, dt, lora=None):
        return ()

    def velocity(self, x, te, condition, lora=None):
        return self.v


def test_guided_velocity_uses_the_exact_scale_in_bf16():
    g = torch.Generator().manual_seed(0)
    B, D, P = 3, 8, 4
    v = torch.randn(2 * B, D, P, generator=g).bfloat16()
    x, cond = torch.zeros(B, D, P, dtype=torch.bfloat16), torch.zeros(B, D, P, dtype=torch.bfloat16)
    mu, t = torch.zeros(B, 6, dtype=torch.bfloat16), torch.zeros(B, dtype=torch.bfloat16)
    te = torch.zeros(2 * B, 6, dtype=torch.bfloat16)
    solver = CFMSolver(FixedVelocity(v))
    shared = solver.condition(mu, cond, t)
    got = solver.guided_velocity(x, te, shared, torch.full((B,), 1.8))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, solver.guided_velocity(x, te, shared, 1.8))  # a float alike
    # The reference's expression (UnifiedCFM.solve_euler) with a Python float scale.
    pos, neg = v[:B], v[B:]
    st = ((pos * neg).reshape(B, -1).sum(1, keepdim=True)
          / ((neg.reshape(B, -1) ** 2).sum(1, keepdim=True) + 1e-8)).view(B, 1, 1)
    want = neg * st + 1.8 * (pos - neg * st)
    assert torch.equal(got, want)
    rounded = neg * st + torch.tensor(1.8, dtype=torch.bfloat16) * (pos - neg * st)  # 1.796875
    assert not torch.equal(got, rounded)


@pytest.fixture(scope="module")
def bf16_vox(tmp_path_factory):
    path = write_checkpoint(str(tmp_path_factory.mktemp("cfg_ckpt")), TINY_CONFIG, seed=7, progress=None)
    return VoxCPM2.from_pretrained(path, device="cpu", dtype="bfloat16")


def test_bf16_engine_keeps_cfg_in_fp32(bf16_vox):
    eng = Engine(bf16_vox, EngineConfig(num_blocks=64, block_size=4))
    try:
        assert eng.runner.cfg.dtype == torch.float32
        prompt = bf16_vox.prepare_prompt("Guided by 1.8.")
        h = eng.submit(EngineRequest("r", prompt, seed=3, cfg_value=1.8, min_len=3, max_len=3))
        events = list(h.events(timeout=120))
        assert isinstance(events[-1], Finished) and events[-1].error is None
        assert eng.runner.cfg[0].item() == torch.tensor(1.8, dtype=torch.float32).item()
    finally:
        eng.shutdown()
