"""The multi-adapter LoRA kernel (`kernels.lora`) against a plain per-token loop over the slot tables.

Runs compiled on a CUDA machine; elsewhere under Triton's CPU interpreter (TRITON_INTERPRET=1, set
by conftest.py before triton is imported); fails where triton is not installed.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_module, skip_unless_kernels_run

require_module("triton", "requirements-test.txt")

from voxcpm_triton.kernels import lora as lk  # noqa: E402
from voxcpm_triton.model.lora import LoraBatch, LoraTables, lora_add, sites_for  # noqa: E402

CUDA = torch.cuda.is_available()
skip_unless_kernels_run(lk)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

DEV = torch.device("cuda" if CUDA else "cpu")


def _tables(linears: dict, ranks: dict, max_rank: int, seed: int = 0):
    """A site over `linears`, slots 1.. written with random adapters of the given ranks (an adapter
    may skip a target: rank 0), -> (tables, site, {slot: {module: (A, B)}}, scale per slot)."""
    g = torch.Generator().manual_seed(seed)
    site = sites_for(linears, list(linears))
    t = LoraTables(site, max_loras=len(ranks), max_rank=max_rank, dtype=torch.float32, device=DEV)
    weights = {}
    for slot, per_target in ranks.items():
        w = {m: (torch.randn(r, linears[m][0], generator=g), torch.randn(linears[m][1], r, generator=g))
             for m, r in zip(linears, per_target) if r}
        t.write(slot, w, scale=0.5 * slot)
        weights[slot] = w
    return t, site[0], weights


def _want(x, y, rows, halves, linears, weights):
    """Token i is in row (i // T) % G of its block; its delta is its row's adapter, target by target."""
    G = len(rows)
    T = x.size(0) // (halves * G)
    out = y.clone().double()
    for i in range(x.size(0)):
        slot = int(rows[(i // T) % G])
        parts = []
        for m, (_, o) in linears.items():
            ab = weights.get(slot, {}).get(m)
            parts.append(x[i].double() @ ab[0].double().T @ ab[1].double().T * 0.5 * slot if ab is not None
                         else torch.zeros(o, dtype=torch.float64))
        out[i] += torch.cat(parts)
    return out


QKV = {"m.self_attn.q_proj": (40, 64), "m.self_attn.k_proj": (40, 16), "m.self_attn.v_proj": (40, 32)}


@pytest.mark.parametrize("rows, halves, T", [
    ([2, 0, 3, 1], 2, 3),  # LocDiT-like: CFG halves, several tokens per row, one row on the base
    ([1], 1, 1),  # one request, one token (an LM decode step at batch 1)
    ([3, 3, 0, 2, 1, 0, 1], 1, 1),  # LM decode: a slot shared by rows, base rows in between
    ([2], 1, 37),  # one row, more tokens than a tile
])
def test_kernel_equals_per_token_loop(rows, halves, T):
    """Fused q/k/v (three targets of different widths; one adapter lacks k), ranks below the
    tables' (zero padding), K not a multiple of the K tile."""
    t, site, weights = _tables(QKV, {1: (4, 4, 4), 2: (2, 0, 2), 3: (3, 3, 3)}, max_rank=4)
    g = torch.Generator().manual_seed(1)
    rows = torch.tensor(rows, device=DEV)
    M = halves * len(rows) * T
    x = torch.randn(M, 40, generator=g).to(DEV)
    y = torch.randn(M, 112, generator=g).to(DEV)
    got = lk.lora_add(y, x, t.a[site.name], t.b[site.name], rows, site.splits, halves)
    want = _want(x.cpu(), y.cpu(), rows.cpu(), halves, QKV, weights)
    assert got.shape == y.shape and got.dtype == y.dtype
    assert (got.cpu().double() - want).abs().max().item() <= (1e-4 if not CUDA else 2e-2)
    base = (rows == 0).nonzero().flatten().tolist()
    if base and halves == 1 and T == 1:  # rows on slot 0 are y exactly
        assert torch.equal(got[base], y[base])


def test_bf16_rounds_once_like_the_reference():
    """bf16 tables and activations: within bf16 rounding of the fp64 result."""
    t, site, weights = _tables(QKV, {1: (4, 4, 4), 2: (4, 4, 4)}, max_rank=4)
    g = torch.Generator().manual_seed(2)
    a, b = t.a[site.name].to(torch.bfloat16), t.b[site.name].to(torch.bfloat16)
    rows = torch.tensor([1, 2, 0], device=DEV)
    x = torch.randn(6, 40, generator=g).to(DEV, torch.bfloat16)
    y = torch.randn(6, 112, generator=g).to(DEV, torch.bfloat16)
    got = lk.lora_add(y, x, a, b, rows, site.splits, 2)
    want = _want(x.cpu().float(), y.cpu().float(), rows.cpu(), 2,
                 QKV, {s: {m: (A.bfloat16().float(), B.bfloat16().float()) for m, (A, B) in w.items()}
                       for s, w in weights.items()})
    assert got.dtype == torch.bfloat16
    assert (got.cpu().double() - want).abs().max().item() <= 0.05 * want.abs().max().item()


def test_kernel_op_through_lora_batch_and_shapes():
    """`LoraBatch` hands decode ops to the kernel when the tables say so (prefills stay "group"),
    and `lora_add` keeps y's leading shape."""
    t, site, _ = _tables(QKV, {1: (4, 4, 4)}, max_rank=4)
    t.kernel = True
    op = LoraBatch(t, torch.tensor([1, 0], device=DEV)).op(site.name)
    assert op.mode == "kernel"
    assert LoraBatch(t, torch.tensor([1], device=DEV), single=True).op(site.name).mode == "group"
    x = torch.randn(2, 1, 40, device=DEV)
    y = torch.randn(2, 1, 112, device=DEV)
    got = lora_add(y, x, op)
    t.kernel = False
    want = lora_add(y, x, LoraBatch(t, torch.tensor([1, 0], device=DEV)).op(site.name))
    assert got.shape == y.shape and (got - want).abs().max().item() <= 1e-4


def test_chunks_and_overrides():
    """One row gets the shortest chunks (the most programs); many rows the longest. Any chunk and
    tile width gives the same result, including chunks that end inside a tile."""
    assert lk.chunk(1, (2048, 256, 256)) == lk.BLOCK_N
    assert lk.chunk(64, (2048, 256, 256)) == lk.MAX_CHUNK
    t, site, weights = _tables(QKV, {1: (4, 4, 4), 2: (2, 0, 2)}, max_rank=4)
    rows = torch.tensor([2, 1, 0], device=DEV)
    x, y = torch.randn(6, 40, device=DEV), torch.randn(6, 112, device=DEV)
    want = _want(x.cpu(), y.cpu(), rows.cpu(), 2, QKV, weights)
    for bn, cols in ((16, 16), (16, 48), (32, 64), (64, 64)):
        got = lk._launch(y, x, t.a[site.name], t.b[site.name], rows, site.splits, 2, bn=bn, cols=cols)
        assert (got.cpu().double() - want).abs().max().item() <= (1e-4 if not CUDA else 2e-2), (bn, cols)
    assert lk.supports((2048, 256, 256), 32) and lk.supports((8, 4, 4), 4) and not lk.supports((1, 1, 1, 1), 4)
    assert lk.supports((64,), lk.MAX_RANK) and not lk.supports((64,), lk.MAX_RANK + 1)
