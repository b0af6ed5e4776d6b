"""The Triton paged decode attention kernel against the PyTorch reference.

Runs compiled on a CUDA machine with triton; elsewhere under Triton's CPU interpreter
(TRITON_INTERPRET=1, set here before the kernel module is imported). triton is installed by
scripts/setup.sh (requirements-test.txt): without it the module fails. Pool blocks and slots
that must not be read are filled with NaN.

Timing on a GPU: `python3 benchmarks/kernel_paged_attention.py`
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.fail("triton is not installed: scripts/setup.sh should have installed it (requirements-test.txt)",
                pytrace=False)

CUDA = torch.cuda.is_available()
if not CUDA:
    # Read when triton.jit decorates a function, triton's own library included: set before importing it.
    os.environ["TRITON_INTERPRET"] = "1"

import triton.language as tl  # noqa: E402

from voxcpm_triton.kernels import paged_attention as ta  # noqa: E402
from voxcpm_triton.engine.attention import paged_decode_attention  # noqa: E402

if not CUDA:
    if type(tl.cdiv).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run this file in its own "
                    "process (or export TRITON_INTERPRET=1)", allow_module_level=True)
    if not ta._INTERPRETED:  # imported earlier without the interpreter: decorate again
        ta = importlib.reload(ta)

# triton's interpreter itself trips numpy's scalar-conversion DeprecationWarning on every loop bound
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

DEV = torch.device("cuda" if CUDA else "cpu")
TOL = {torch.float32: 1e-4 if not CUDA else 2e-4, torch.bfloat16: 2e-2}


def make_case(B, Hq, Hkv, D, bs, ctx, dtype, *, width=None, seed=0, spare_blocks=5):
    """Random q and pools; each request gets its own shuffled blocks, padded with 0 in the table.
    Every slot that is not part of some context (unused blocks, block 0, tails past a context) is NaN."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.as_tensor(ctx, dtype=torch.int64)
    need = [math.ceil(int(c) / bs) for c in ctx]
    width = width or max(max(need), 1)
    num_blocks = 1 + sum(need) + spare_blocks
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # block 0 is never handed out
    kp = torch.full((num_blocks, bs, Hkv, D), float("nan"))
    vp = torch.full_like(kp, float("nan"))
    bt = torch.zeros(B, width, dtype=torch.int64)
    for b in range(B):
        mine = [ids.pop() for _ in range(need[b])]
        bt[b, :len(mine)] = torch.tensor(mine, dtype=torch.int64)
        for i, blk in enumerate(mine):
            n = min(bs, int(ctx[b]) - i * bs)
            kp[blk, :n] = torch.randn(n, Hkv, D, generator=g)
            vp[blk, :n] = torch.randn(n, Hkv, D, generator=g)
    q = torch.randn(B, 1, Hq, D, generator=g)
    to = lambda t: t.to(DEV, dtype)  # noqa: E731
    return to(q), to(kp), to(vp), bt.to(DEV), ctx.to(DEV)


def reference(q, kp, vp, bt, ctx):
    """fp32 PyTorch reference on the same (possibly bf16-rounded) values; NaN poison zeroed, since
    the reference gathers whole blocks and relies on masking (NaN * 0 would leak)."""
    f = lambda t: t.float().nan_to_num(0.0)  # noqa: E731
    return paged_decode_attention(f(q), f(kp), f(vp), bt, ctx)


def check(out, q, kp, vp, bt, ctx, dtype):
    ref = reference(q, kp, vp, bt, ctx)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out.float()).all()
    err = (out.float() - ref).abs().max().item()
    assert err <= TOL[dtype], f"max abs err {err:.3g} > {TOL[dtype]}"


# (B, Hq, Hkv, D, block_size, contexts)
SHAPES = [
    (1, 16, 2, 128, 16, [1]),
    (1, 16, 2, 128, 16, [16]),  # exactly one block
    (3, 16, 2, 128, 16, [17, 64, 65]),  # block and tile boundaries
    (17, 16, 2, 128, 16, "ragged"),
    (3, 4, 2, 16, 16, [5, 32, 100]),
    (3, 4, 1, 16, 8, [1, 9, 47]),
    (3, 4, 2, 12, 4, [3, 4, 29]),  # head_dim 12: padded to 16
    (17, 4, 1, 12, 32, "ragged"),
    (3, 6, 3, 24, 16, [7, 48, 130]),  # group 2, head_dim 24 -> 32
]


def _contexts(spec, B, seed=1):
    if spec == "ragged":
        g = torch.Generator().manual_seed(seed)
        return torch.randint(1, 200, (B,), generator=g).tolist()
    return spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("B,Hq,Hkv,D,bs,ctx", SHAPES,
                         ids=[f"B{s[0]}-Hq{s[1]}-Hkv{s[2]}-D{s[3]}-bs{s[4]}" for s in SHAPES])
def test_matches_reference(B, Hq, Hkv, D, bs, ctx, dtype):
    q, kp, vp, bt, cl = make_case(B, Hq, Hkv, D, bs, _contexts(ctx, B), dtype)
    check(ta.paged_decode_attention_triton(q, kp, vp, bt, cl), q, kp, vp, bt, cl, dtype)


@pytest.mark.parametrize("splits", [1, 2, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_k(splits, dtype):
    """Split-K merges partial softmaxes; splits with no tokens (context 1 over 16 splits) are inert."""
    ctx = [1, 16, 63, 64, 65, 300]
    q, kp, vp, bt, cl = make_case(len(ctx), 16, 2, 128, 16, ctx, dtype, width=24)
    out = ta.paged_decode_attention_triton(q, kp, vp, bt, cl, num_splits=splits)
    check(out, q, kp, vp, bt, cl, dtype)


@pytest.mark.parametrize("block_n", [16, 32, 128])
def test_block_n(block_n):
    ctx = [1, 31, 33, 150]
    q, kp, vp, bt, cl = make_case(len(ctx), 4, 2, 16, 8, ctx, torch.float32)
    out = ta.paged_decode_attention_triton(q, kp, vp, bt, cl, block_n=block_n, num_splits=2)
    check(out, q, kp, vp, bt, cl, torch.float32)


def test_wide_table_and_full_table():
    """A table far wider than any context (the engine's fixed max_blocks), and a context that fills
    its table exactly."""
    q, kp, vp, bt, cl = make_case(3, 16, 2, 128, 16, [20, 5, 33], torch.float32, width=64)
    check(ta.paged_decode_attention_triton(q, kp, vp, bt, cl), q, kp, vp, bt, cl, torch.float32)
    q, kp, vp, bt, cl = make_case(2, 16, 2, 128, 16, [48, 48], torch.float32, width=3)
    check(ta.paged_decode_attention_triton(q, kp, vp, bt, cl), q, kp, vp, bt, cl, torch.float32)


def test_strided_inputs_and_int32_metadata():
    """q as a view into a fused projection, a column-sliced int32 block table, int32 context_lens,
    and an out= view."""
    B, Hq, Hkv, D = 3, 4, 2, 16
    q, kp, vp, bt, cl = make_case(B, Hq, Hkv, D, 4, [3, 17, 40], torch.float32, seed=3)
    fused = torch.randn(B, 1, Hq + 2 * Hkv, D, device=DEV)
    fused[:, :, :Hq] = q
    qv = fused[:, :, :Hq]
    assert not qv.is_contiguous()
    wide = torch.zeros(B, 2 * bt.size(1) + 1, dtype=torch.int32, device=DEV)
    wide[:, 1::2] = bt.to(torch.int32)
    btv = wide[:, 1::2]
    assert not btv.is_contiguous()
    out_buf = torch.full((B, Hq, 1, D), float("nan"), device=DEV)
    out = ta.paged_decode_attention_triton(qv, kp, vp, btv, cl.to(torch.int32), out=out_buf.transpose(1, 2))
    assert out.data_ptr() == out_buf.data_ptr()
    check(out, q, kp, vp, bt, cl, torch.float32)


def test_empty_context_gives_zeros_like_reference():
    q, kp, vp, bt, cl = make_case(2, 4, 2, 16, 16, [0, 5], torch.float32)
    for splits in (1, 4):
        out = ta.paged_decode_attention_triton(q, kp, vp, bt, cl, num_splits=splits)
        check(out, q, kp, vp, bt, cl, torch.float32)
        assert (out[0] == 0).all()


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_new_kv_written_and_attended(splits, dtype):
    """new_kv: the kernel writes each row's new K/V into its slot and attends to them, where the slot
    is still unwritten (NaN) when it starts: pools and output as `write_kv` then the kernel. K and V
    are views into a fused projection; one context is past the table's width (written, not seen)."""
    from voxcpm_triton.engine.attention import write_kv

    B, Hq, Hkv, D, bs = 5, 16, 2, 128, 16
    ctx = [1, 17, 64, 150, 300]  # 150: its new token in the third of 4 splits
    q, kp, vp, full, cl = make_case(B, Hq, Hkv, D, bs, ctx, dtype, seed=5)
    pos = cl - 1
    slots = full.gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
    bt = full[:, :12]  # 192 positions: the last row's new one is past it
    kp.view(-1, Hkv, D)[slots] = float("nan")  # not written yet
    vp.view(-1, Hkv, D)[slots] = float("nan")
    fused = torch.randn(B, 1, Hq + 2 * Hkv, D, device=DEV).to(dtype)
    k_new, v_new = fused[:, :, Hq:Hq + Hkv], fused[:, :, Hq + Hkv:]
    assert not k_new.is_contiguous()
    want_k, want_v = kp.clone(), vp.clone()
    write_kv(want_k[None], want_v[None], 0, slots, k_new, v_new)
    # Written elsewhere (block 0, never in a table): the new token's own slot is never read.
    kp2, vp2 = kp.clone(), vp.clone()
    out = ta.paged_decode_attention_triton(q, kp2, vp2, bt, cl, num_splits=splits,
                                           new_kv=(k_new, v_new, torch.zeros_like(slots)))
    check(out, q, want_k, want_v, bt, cl, dtype)
    out = ta.paged_decode_attention_triton(q, kp, vp, bt, cl, num_splits=splits, new_kv=(k_new, v_new, slots))
    assert torch.equal(kp.nan_to_num(7.0), want_k.nan_to_num(7.0))
    assert torch.equal(vp.nan_to_num(7.0), want_v.nan_to_num(7.0))
    check(out, q, want_k, want_v, bt, cl, dtype)


def test_bf16_matches_bf16_reference():
    q, kp, vp, bt, cl = make_case(4, 16, 2, 128, 16, [1, 40, 129, 250], torch.bfloat16, seed=7)
    z = lambda t: t.nan_to_num(0.0)  # noqa: E731
    ref = paged_decode_attention(q, z(kp), z(vp), bt, cl)
    out = ta.paged_decode_attention_triton(q, kp, vp, bt, cl)
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2


def test_available_is_bool():
    assert isinstance(ta.available(), bool)
    assert ta.available() == CUDA


def test_choose_num_splits_depends_on_shapes_only():
    assert ta.choose_num_splits(1, 2, 512, 64, torch.device("cpu")) == 1
    if CUDA:
        s1 = ta.choose_num_splits(1, 2, 4096, 64, DEV)
        assert 1 < s1 <= 16 and s1 & (s1 - 1) == 0
        assert ta.choose_num_splits(128, 2, 4096, 64, DEV) == 1  # 256 programs >= SMs
        assert ta.choose_num_splits(1, 2, 16, 64, DEV) == 1  # one tile: nothing to split


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("B", [1, 32])
def test_cuda_graph_capture_and_replay(B):
    """Capture once with static buffers, then change block tables and context lengths in place and
    replay: the graph must follow the new metadata."""
    Hq, Hkv, D, bs, width = 16, 2, 128, 16, 40
    dtype = torch.bfloat16
    q, kp, vp, bt, cl = make_case(B, Hq, Hkv, D, bs, [1 + 37 * i % 600 for i in range(B)], dtype, width=width,
                                  spare_blocks=B * width)
    kp, vp = kp.nan_to_num(0.0), vp.nan_to_num(0.0)  # later contexts grow into blocks poisoned now
    s_q, s_bt, s_cl = q.clone(), bt.clone(), cl.clone()
    ta.paged_decode_attention_triton(s_q, kp, vp, s_bt, s_cl)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s_out = ta.paged_decode_attention_triton(s_q, kp, vp, s_bt, s_cl)
    for step in range(3):
        g = torch.Generator().manual_seed(100 + step)
        new_cl = torch.randint(1, width * bs + 1, (B,), generator=g)
        new_bt = torch.stack([torch.randperm(kp.size(0) - 1, generator=g)[:width] + 1 for _ in range(B)])
        new_q = torch.randn(B, 1, Hq, D, generator=g)
        s_cl.copy_(new_cl)
        s_bt.copy_(new_bt)
        s_q.copy_(new_q)
        graph.replay()
        torch.cuda.synchronize()
        check(s_out, s_q, kp, vp, s_bt, s_cl, dtype)


@pytest.mark.parametrize("start,L,as_tensor", [(7, 6, False), (12, 1, True), (3, 17, True)])
def test_prefill_after_a_cached_prefix(start, L, as_tensor):
    """Queries of positions start .. start+L-1 over the prompt's blocks from position 0 (the prefix
    cache's path): the PyTorch gather and the decode kernel run per query equal plain causal
    attention over the contiguous keys. `start` as a device tensor is the prefill graphs' form."""
    from voxcpm_triton.engine.attention import paged_prefill_attention, paged_prefill_attention_triton

    Hq, Hkv, D, bs, T = 4, 2, 16, 4, start + L
    g = torch.Generator().manual_seed(start * 100 + L)
    k, v = torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g)
    q = torch.randn(1, L, Hq, D, generator=g)
    n = -(-T // bs)
    table = torch.randperm(2 * n, generator=g)[:n] + 1
    kp = torch.randn(2 * n + 1, bs, Hkv, D, generator=g)  # stale values everywhere else: the kernel must not read
    vp = torch.randn_like(kp)
    pos = torch.arange(T)
    kp[table[pos // bs], pos % bs], vp[table[pos // bs], pos % bs] = k, v
    mask = torch.arange(T)[None] <= (start + torch.arange(L))[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2), attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    s = torch.tensor([start], device=DEV) if as_tensor else start
    got = paged_prefill_attention(q.to(DEV), kp.to(DEV), vp.to(DEV), table.to(DEV), s)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    # The kernel reads only the keys each query sees: a table padded with the scratch block 0, and
    # every slot past the prompt poisoned with NaN, change nothing.
    wide = torch.cat([table, torch.zeros(3, dtype=torch.int64)])
    poisoned_k, poisoned_v = kp.clone(), vp.clone()
    for t in range(T, n * bs):
        poisoned_k[table[t // bs], t % bs] = poisoned_v[table[t // bs], t % bs] = float("nan")
    poisoned_k[0] = poisoned_v[0] = float("nan")
    got = paged_prefill_attention_triton(q.to(DEV), poisoned_k.to(DEV), poisoned_v.to(DEV), wide.to(DEV), s)
    torch.testing.assert_close(got.cpu(), want, atol=TOL[torch.float32], rtol=TOL[torch.float32])


def test_packed_prefill_as_decode_rows_equals_per_prompt_attention():
    """The engine's packed prefill after cached prefixes on the GPU path: every new position of
    every prompt is a row of the decode kernel (`PrefillRowsMetadata`), one launch per layer. Two
    prompts, one after a cached prefix and one from position 0: each equals causal attention over
    its own contiguous keys, and the new K/V land in their slots."""
    from voxcpm_triton.engine.attention import PagedAttention, PrefillRowsMetadata

    Hq, Hkv, D, bs = 4, 2, 16, 4
    g = torch.Generator().manual_seed(7)
    kp = torch.randn(16, bs, Hkv, D, generator=g)  # stale values in every block
    vp = torch.randn_like(kp)
    prompts = [(6, 5, [3, 9, 5]), (0, 7, [11, 2])]  # (cached positions, new positions, block table)
    rows, ctx, slots, qs, ks, vs, wants = [], [], [], [], [], [], []
    for start, n, table in prompts:
        T = start + n
        k_all, v_all = torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g)
        pos = torch.arange(T)
        kp[torch.tensor(table)[pos[:start] // bs], pos[:start] % bs] = k_all[:start]  # the cached prefix
        vp[torch.tensor(table)[pos[:start] // bs], pos[:start] % bs] = v_all[:start]
        q = torch.randn(n, Hq, D, generator=g)
        mask = torch.arange(T)[None] <= (start + torch.arange(n))[:, None]
        wants.append(torch.nn.functional.scaled_dot_product_attention(
            q[None].transpose(1, 2), k_all[None].transpose(1, 2), v_all[None].transpose(1, 2), attn_mask=mask,
            enable_gqa=True).transpose(1, 2)[0])
        rows += [table + [0] * (3 - len(table))] * n
        ctx += list(range(start + 1, T + 1))
        slots += [table[p // bs] * bs + p % bs for p in range(start, T)]
        qs.append(q), ks.append(k_all[start:]), vs.append(v_all[start:])
    meta = PrefillRowsMetadata(torch.tensor(slots, device=DEV), torch.tensor(rows, device=DEV),
                               torch.tensor(ctx, device=DEV))
    kpd, vpd = kp[None].clone().to(DEV), vp[None].clone().to(DEV)  # one layer
    got = PagedAttention(kpd, vpd, meta, use_triton=True)(0, torch.cat(qs)[None].to(DEV), torch.cat(ks)[None].to(DEV),
                                                          torch.cat(vs)[None].to(DEV))
    torch.testing.assert_close(got[0].cpu(), torch.cat(wants), atol=TOL[torch.float32], rtol=TOL[torch.float32])
    flat = kpd[0].reshape(-1, Hkv, D).cpu()
    torch.testing.assert_close(flat[torch.tensor(slots)], torch.cat(ks))
