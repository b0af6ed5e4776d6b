"""The fused LocDiT/LocEnc attention kernel (`kernels.local_attention`) against the PyTorch path
(`LayerMath.attention_inputs` then `minicpm.local_attention`), and inside LocDiT/LocEnc.

Runs compiled on a CUDA machine; elsewhere under Triton's CPU interpreter (TRITON_INTERPRET=1,
set by conftest.py before triton is imported); fails where triton is not installed (setup.sh installs it).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_module, skip_unless_kernels_run
from tests.layer_helpers import rope as rope_tables
from tests.layer_helpers import stack_depth

require_module("triton", "requirements-test.txt")

from voxcpm_triton.kernels import local_attention as lat  # noqa: E402
from voxcpm_triton.model.minicpm import apply_rope, local_attention  # noqa: E402

CUDA = torch.cuda.is_available()
skip_unless_kernels_run(lat)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

DEV = torch.device("cuda" if CUDA else "cpu")
# bf16: outputs of magnitude ~1 carry 8 bits, and the probabilities are rounded to bf16 for the
# value product (as flash attention does) while the reference keeps them in fp32.
TOL = {torch.float32: 1e-4 if not CUDA else 2e-4, torch.bfloat16: 3e-2}


def make_case(B, S, Hq, Hkv, D, dtype, rope=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B * S, (Hq + 2 * Hkv) * D, generator=g).to(DEV, dtype)
    if not rope:
        return qkv, None, None
    return (qkv, *rope_tables(S, D))  # rotate-half tables, as minicpm.LongRoPE builds them


def reference(qkv, cos, sin, S, Hq, Hkv, D):
    """The PyTorch path on the same values: split, RoPE (rounded to the input dtype), then SDPA in fp32."""
    B = qkv.size(0) // S
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.reshape(-1, Hq, D), k.reshape(-1, Hkv, D), v.reshape(-1, Hkv, D)
    if cos is not None:
        c, s = cos.repeat(B, 1), sin.repeat(B, 1)
        q, k = apply_rope(q, c, s), apply_rope(k, c, s)
    f = lambda t, h: t.float().view(B, S, h, D)  # noqa: E731
    return local_attention(0, f(q, Hq), f(k, Hkv), f(v, Hkv)).reshape(B * S, Hq * D)


# (B sequences, S tokens, Hq, Hkv, D)
SHAPES = [
    (2, 11, 16, 2, 128),  # LocDiT at batch 1 (CFG doubles it)
    (7, 5, 16, 2, 128),  # LocEnc
    (9, 11, 16, 2, 128),  # an odd count (head blocking: test_every_head_blocking_agrees)
    (3, 1, 4, 2, 16),  # one token
    (3, 17, 4, 1, 16),  # past 16 tokens: padded to 32
    (2, 6, 3, 1, 12),  # the test variant's LocDiT: head dim 12 (halves padded), group 3
    (1, 64, 2, 2, 32),  # the longest sequence, no grouping
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("B,S,Hq,Hkv,D", SHAPES, ids=[f"B{s[0]}-S{s[1]}-Hq{s[2]}-Hkv{s[3]}-D{s[4]}" for s in SHAPES])
def test_matches_pytorch_path(B, S, Hq, Hkv, D, rope, dtype):
    qkv, cos, sin = make_case(B, S, Hq, Hkv, D, dtype, rope)
    out = lat.local_attention_op(qkv, cos, sin, S, Hq, Hkv, D)
    assert out.shape == (B * S, Hq * D) and out.dtype == dtype
    err = (out.float() - reference(qkv, cos, sin, S, Hq, Hkv, D)).abs().max().item()
    assert err <= TOL[dtype], f"max abs err {err:.3g}"


@pytest.mark.parametrize("heads", [1, 2, 4, 8])
def test_every_head_blocking_agrees(heads):
    qkv, cos, sin = make_case(3, 11, 16, 2, 128, torch.float32)
    out = lat._launch(qkv, cos, sin, 11, 16, 2, 128, heads=heads)
    assert (out - reference(qkv, cos, sin, 11, 16, 2, 128)).abs().max().item() <= TOL[torch.float32]


@pytest.mark.parametrize("config", ["full", "variant"])
def test_local_modules_rope_tables_repeat_their_frequencies(config):
    """The kernel reads the first half of the RoPE tables: LocDiT's and LocEnc's (LongRoPE with the
    full-size model's factors, and with the test variant's, which differ per frequency) must repeat it
    in the second."""
    import json
    from pathlib import Path

    from tests.conftest import variant_config
    from voxcpm_triton.model.config import VoxCPM2Config
    from voxcpm_triton.model.minicpm import LongRoPE

    full = Path(__file__).resolve().parents[1] / "benchmarks" / "voxcpm2_config.json"
    d = json.loads(full.read_text()) if config == "full" else variant_config()
    cfg = VoxCPM2Config.from_dict(d)
    for lm in (cfg.local_dit(), cfg.local_encoder()):
        rope = LongRoPE(lm)
        half = lm.head_dim // 2
        for table in (rope.cos, rope.sin):
            assert torch.equal(table[:, :half], table[:, half:]), lm
        assert not torch.equal(rope.cos[1:, :half], rope.cos[1:, :half].roll(1, dims=1))  # frequencies differ


def test_heads_per_program():
    assert lat.heads_per_program(16, 2) == 4  # LocDiT/LocEnc: groups of 8, 4 heads per program
    assert lat.heads_per_program(12, 1) == 4
    assert lat.heads_per_program(4, 2) == 2  # a power of 2 that divides the group
    assert lat.heads_per_program(3, 1) == 1


def test_rejects_what_it_cannot_do():
    qkv, cos, sin = make_case(1, 65, 2, 2, 16, torch.float32)
    with pytest.raises(AssertionError, match="at most 64"):
        lat.local_attention_op(qkv, cos[:65], sin[:65], 65, 2, 2, 16)
    with pytest.raises(AssertionError):
        lat.local_attention_op(qkv[:, :-1], None, None, 65, 2, 2, 16)


@pytest.mark.parametrize("name,B,fused_layers", [("real_shaped", 2, 4), ("real_shaped", 9, 2), ("variant", 2, 0)])
def test_locdit_and_locenc_match_with_the_kernel(checkpoint_dirs, name, B, fused_layers, monkeypatch):
    """The whole LocDiT velocity and LocEnc embedding, PyTorch path vs the fused kernels (fp32). The
    fused backend also takes whole layers (`kernels.persistent_layer`) of at most 96 tokens without muP:
    LocDiT's (B x 11 tokens) and LocEnc's (B x 2 x 5) at B = 2, only LocEnc's at B = 9 (99 and 90), none in the
    variant (muP)."""
    from voxcpm_triton.kernels import persistent_layer
    from voxcpm_triton.voxcpm2 import VoxCPM2

    calls = []  # per layer run, its input's shape (a stack's one launch runs several)
    layer = persistent_layer.layer
    monkeypatch.setattr(persistent_layer, "layer", lambda *a, **k: calls.extend(
        [a[0].shape] * max(1, stack_depth(k))) or layer(*a, **k))
    m = VoxCPM2.from_pretrained(checkpoint_dirs[name], device=DEV.type, dtype="float32", attention="torch").model
    fused = VoxCPM2.from_pretrained(checkpoint_dirs[name], device=DEV.type, dtype="float32", attention="triton").model
    assert fused.feat_decoder.estimator.attention is persistent_layer.fused_local_layers
    assert fused.feat_encoder.attention is persistent_layer.fused_local_layers
    assert m.feat_decoder.estimator.attention is local_attention
    g = torch.Generator().manual_seed(3)
    P, D = m.patch_size, m.feat_dim
    hdit = m.feat_decoder.estimator.hidden
    x, cond = torch.randn(B, D, P, generator=g), torch.randn(B, D, P, generator=g)
    mu, t = torch.randn(B, 2 * hdit, generator=g), torch.rand(B, generator=g)
    feats = torch.randn(B, 2, P, D, generator=g)
    args = [a.to(DEV) for a in (x, mu, t, cond, torch.zeros(B))]
    with torch.no_grad():
        ref_v, ref_e = m.feat_decoder.estimator(*args), m.feat_encoder(feats.to(DEV))
        out_v, out_e = fused.feat_decoder.estimator(*args), fused.feat_encoder(feats.to(DEV))
    assert (out_v - ref_v).abs().max().item() <= 1e-4
    assert (out_e - ref_e).abs().max().item() <= 1e-4
    assert len(calls) == (0 if CUDA else fused_layers), calls  # fp32: fused on the GPU only at 16 bits


@pytest.mark.skipif(not CUDA, reason="torch.compile and CUDA graphs need a GPU")
def test_compiles_and_captures():
    """As the engine runs it: inside torch.compile (dynamic batch), then replayed from a CUDA graph."""
    S, Hq, Hkv, D = 11, 16, 2, 128
    qkv, cos, sin = make_case(8, S, Hq, Hkv, D, torch.bfloat16)
    f = torch.compile(lambda a: lat.local_attention_op(a * 1.0, cos, sin, S, Hq, Hkv, D), dynamic=True)
    ref = reference(qkv, cos, sin, S, Hq, Hkv, D)
    assert (f(qkv).float() - ref).abs().max().item() <= TOL[torch.bfloat16]
    static = qkv.clone()
    f(static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(static)
    static.copy_(make_case(8, S, Hq, Hkv, D, torch.bfloat16, seed=5)[0])
    graph.replay()
    torch.cuda.synchronize()
    assert (out.float() - reference(static, cos, sin, S, Hq, Hkv, D)).abs().max().item() <= TOL[torch.bfloat16]
