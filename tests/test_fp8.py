"""FP8 weights (`kernels.fp8`, `model.precision`): e4m3 quantisation with per-channel weight scales
and per-token activation scales, the linear that runs it, and which weights of the network it swaps.

The arithmetic is checked on the CPU through the emulated GEMM (the same products from the
dequantised values, summed in fp32), against exact bounds of e4m3 rounding; the last test, on a
GPU only, holds `torch._scaled_mm` to the emulation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import CONFIGS
from voxcpm_triton import VoxCPM2
from voxcpm_triton.kernels import fp8
from voxcpm_triton.model.config import VoxCPM2Config
from voxcpm_triton.model.precision import KEEP, FP8Linear, quantize_model_fp8, resolve_precision

# e4m3: 3 mantissa bits, so rounding a normal value costs at most 2^-4 of it; below the smallest
# normal (2^-6) the grid is uniform with step 2^-9, so at most 2^-10 (in units of the scale).
REL = 2.0 ** -4
SUBNORMAL_ABS = 2.0 ** -10


def heavy_tailed(*shape, seed=0):
    """Gaussian values with a few large outliers per row, as real weights and activations have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    idx = torch.randint(0, shape[-1], (*shape[:-1], 2), generator=g)
    return x.scatter(-1, idx, 30.0 * torch.randn(*shape[:-1], 2, generator=g))


def rounding_bound(v: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on |dequant(quant(v)) - v| for values v quantised with `scale`."""
    return torch.maximum(v.abs() * REL, scale * SUBNORMAL_ABS) * (1 + 1e-6)


def test_weight_round_trip_is_within_e4m3_rounding_per_channel():
    w = heavy_tailed(96, 64)
    w[5] = 0.0  # a dead channel
    w[7] *= 1e-4  # a channel far smaller than the others: its own scale keeps its precision
    q = fp8.quantize_weight(w)
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == (96, 64) and q.data.is_contiguous()
    assert q.scale.dtype == torch.float32 and q.scale.shape == (1, 96) and q.scale._base is None
    assert q.dtype == torch.float32
    amax = w.abs().amax(dim=1)
    assert torch.allclose(q.scale[0], amax.clamp_min(1e-12) / 448, rtol=1e-6)
    deq = q.dequantize().float()
    assert torch.all((deq - w).abs() <= rounding_bound(w, q.scale.t()))
    live = amax > 0
    # Each live channel's largest value lands on e4m3's largest, 448, and comes back exactly.
    assert torch.all(q.data.float().abs().amax(dim=1)[live] == 448)
    assert torch.allclose(deq.abs().amax(dim=1), amax, rtol=1e-6)
    assert torch.all(q.data[5].float() == 0) and torch.isfinite(q.scale).all()
    # Per channel: the small channel is as precise, relative to itself, as any other.
    rel = (deq[7] - w[7]).abs().max() / w[7].abs().max()
    assert rel <= REL


def test_weight_scales_are_per_output_channel():
    w = heavy_tailed(32, 48, seed=1)
    a = fp8.quantize_weight(w)
    w2 = w.clone()
    w2[3] *= 1000.0
    b = fp8.quantize_weight(w2)
    others = torch.arange(32) != 3
    assert torch.equal(a.data[others].float(), b.data[others].float())
    assert torch.equal(a.scale[:, others], b.scale[:, others])
    assert torch.equal(a.data[3].float(), b.data[3].float())  # scaled with its channel: same code words
    assert torch.allclose(b.scale[0, 3], a.scale[0, 3] * 1000, rtol=1e-6)


def test_activation_scales_are_per_token_and_zero_rows_stay_zero():
    x = heavy_tailed(5, 64, seed=2).to(torch.bfloat16)
    x[2] = 0
    q, s = fp8.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 1) and s.dtype == torch.float32
    assert torch.all(q[2].float() == 0) and torch.isfinite(s).all()
    deq = q.float() * s
    assert torch.all((deq - x.float()).abs() <= rounding_bound(x.float(), s))


def test_values_at_the_top_of_the_range_saturate_instead_of_becoming_nan():
    # The e4m3fn cast does not saturate; a value a rounding above 448 * scale must clamp, not turn NaN.
    x = torch.tensor([[448.0, -448.0, 1.0]])
    q, s = fp8._quantize(x, torch.tensor([[447.0]]))
    assert torch.isfinite(q.float()).all() and q.float().abs().max() == 448


@pytest.mark.parametrize("M", [1, 3, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fp8_linear_is_within_the_e4m3_bound_of_the_exact_product(M, dtype):
    K, N = 256, 80
    x = heavy_tailed(M, K, seed=3).to(dtype)
    w = (heavy_tailed(N, K, seed=4) / 16).to(dtype)
    bias = torch.randn(N).to(dtype)
    y = fp8.fp8_linear(x, fp8.quantize_weight(w), bias)
    assert y.dtype == dtype and y.shape == (M, N)
    exact = x.double() @ w.double().T + bias.double()
    # Each product x*w carries both roundings, (1 + 2^-4)^2 - 1; the subnormal floors add
    # |x| * scale_w * 2^-10 and scale_x * |w| * 2^-10 terms; the output is rounded once to `dtype`.
    sx = x.double().abs().amax(dim=1, keepdim=True) / 448
    sw = w.double().abs().amax(dim=1, keepdim=True).T / 448
    ax, aw = x.double().abs(), w.double().abs()
    bound = ((2 * REL + REL ** 2) * (ax @ aw.T) + SUBNORMAL_ABS * (ax.sum(1, keepdim=True) * sw
             + sx * aw.sum(1)[None]) + SUBNORMAL_ABS ** 2 * K * sx * sw)
    out_round = exact.abs() * (2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -23)
    err = (y.double() - exact).abs()
    assert torch.all(err <= bound * 1.001 + out_round + 1e-6), (err - bound).max()
    # And in practice far inside it: the roundings mostly cancel over K terms.
    rel = (y.double() - exact).norm() / exact.norm()
    assert rel < 0.05, rel.item()


def test_emulated_gemm_is_what_scaled_mm_computes():
    """The emulation against torch's own `_scaled_mm` on the CPU (row-wise scales, bias, bf16 out):
    the same layout of scales, the same order of scaling, bias and the one rounding."""
    x = heavy_tailed(7, 64, seed=5).to(torch.bfloat16)
    w = fp8.quantize_weight(heavy_tailed(32, 64, seed=6).to(torch.bfloat16))
    bias = torch.randn(32).to(torch.bfloat16)
    xq, sx = fp8.quantize_rows(x)
    got = fp8.emulated_scaled_mm(xq, w.data.t(), sx, w.scale, bias, torch.bfloat16)
    try:
        want = torch._scaled_mm(xq, w.data.t(), scale_a=sx, scale_b=w.scale, bias=bias, out_dtype=torch.bfloat16)
    except RuntimeError as e:  # torch < 2.13 on the CPU: per-tensor scales only
        if "per-tensor" not in str(e) or not torch.cuda.is_available():
            raise
        pytest.skip("this torch's CPU _scaled_mm has no row-wise scales; the GPU test below checks the kernel")
    # Same products, summed in another order: at most one bf16 rounding step apart.
    assert torch.allclose(got.float(), want.float(), rtol=2 ** -7, atol=1e-3)
    # A transposed scale layout would be caught: the per-channel scales differ by channel.
    wrong = fp8.emulated_scaled_mm(xq, w.data.t(), sx, w.scale.flip(1), bias, torch.bfloat16)
    assert not torch.allclose(wrong.float(), want.float(), rtol=2 ** -7, atol=1e-3)


def test_linear_dispatches_on_the_weight_type():
    x = heavy_tailed(4, 32, seed=7)
    w = heavy_tailed(16, 32, seed=8)
    b = torch.randn(16)
    assert torch.equal(fp8.linear(x, w, b), F.linear(x, w, b))
    q = fp8.quantize_weight(w)
    assert torch.equal(fp8.linear(x, q, b), fp8.fp8_linear(x, q, b))
    assert not torch.equal(fp8.linear(x, q, b), F.linear(x, w, b))
    x3 = heavy_tailed(2, 3, 32, seed=9)  # leading dimensions kept
    assert torch.equal(fp8.linear(x3, q).reshape(6, 16), fp8.linear(x3.reshape(6, 32), q))
    xt = heavy_tailed(32, 4, seed=10).t()  # a transposed input goes in row-major
    assert torch.equal(fp8.linear(xt, q), fp8.linear(xt.contiguous(), q))


def test_eligibility_follows_scaled_mm_shapes():
    assert fp8.eligible(2560, 2048) and fp8.eligible(64, 1024)
    assert not fp8.eligible(2, 2048) and not fp8.eligible(72, 48)


# ---------------------------------------------------------------- which weights of the network
def expected_names(cfg: VoxCPM2Config, eligible) -> tuple[set, set]:
    """The linears quantize_model_fp8 should swap, and those it should keep, from the config alone."""
    lms = {"base_lm": cfg.lm_config, "residual_lm": cfg.residual_lm(),
           "feat_encoder.encoder": cfg.local_encoder(), "feat_decoder.estimator.decoder": cfg.local_dit()}
    want, keep = set(), set(KEEP)
    for prefix, lm in lms.items():
        h, d = lm.hidden_size, lm.head_dim
        shapes = {"self_attn.qkv": ((lm.num_attention_heads + 2 * lm.num_key_value_heads) * d, h),
                  "self_attn.o_proj": (h, lm.num_attention_heads * d),
                  "mlp.gate_up": (2 * lm.intermediate_size, h), "mlp.down_proj": (h, lm.intermediate_size)}
        for i in range(lm.num_hidden_layers):
            for name, (n, k) in shapes.items():
                (want if eligible(n, k) else keep).add(f"{prefix}.layers.{i}.{name}")
    H, D = cfg.lm_config.hidden_size, cfg.feat_dim
    enc_h, dit_h = cfg.encoder_config.hidden_dim, cfg.dit_config.hidden_dim
    dit = "feat_decoder.estimator"
    projections = {"feat_encoder.in_proj": (enc_h, D), f"{dit}.in_proj": (dit_h, D), f"{dit}.cond_proj": (dit_h, D),
                   f"{dit}.out_proj": (D, dit_h), "enc_to_lm_proj": (H, enc_h), "lm_to_dit_proj": (dit_h, H),
                   "res_to_dit_proj": (dit_h, H), "fusion_concat_proj": (H, 2 * H),
                   **{f"{dit}.{m}.linear_{j}": (dit_h, dit_h) for m in ("time_mlp", "delta_time_mlp") for j in (1, 2)}}
    for name, (n, k) in projections.items():
        (want if eligible(n, k) else keep).add(name)
    return want, keep


@pytest.fixture(scope="module", params=list(CONFIGS))
def quantized(request, checkpoint_dirs):
    vox = VoxCPM2.from_pretrained(checkpoint_dirs[request.param], device="cpu", dtype="bfloat16")
    before = {n: p.detach().clone() for n, p in vox.model.named_parameters()}
    fused = {n: m.qkv.clone() for n, m in vox.model.named_modules() if hasattr(m, "qkv")}
    vae = {n: (t.data_ptr(), t.clone()) for n, t in vox.vae.state_dict().items()}
    report = quantize_model_fp8(vox)
    return request.param, vox, report, before, fused, vae


def test_exactly_the_intended_weights_are_quantized(quantized):
    name, vox, report, *_ = quantized
    want, keep = expected_names(vox.cfg, fp8.eligible)
    assert set(report["quantized"]) == want and len(report["quantized"]) == len(want)
    assert set(report["kept"]) == keep
    if name == "real_shaped":  # every shape of the VoxCPM2-shaped model fits: only the deliberate ones stay
        assert set(report["kept"]) == set(KEEP)
    else:  # the variant's head dim 12 makes some QKV widths unfit for _scaled_mm
        assert any(r == "shape not divisible by 16" for r in report["kept"].values())


def test_no_unquantized_copy_of_a_swapped_weight_is_left(quantized):
    _, vox, report, *_ = quantized
    m = vox.model
    matrices = {n for n, p in m.named_parameters() if p.dim() == 2 and p.dtype == torch.bfloat16}
    parts = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}
    kept_weights = set()
    for k in report["kept"]:  # a kept fused group keeps its parts' weights
        mod, _, attr = k.rpartition(".")
        kept_weights |= {f"{mod}.{p}.weight" for p in parts[attr]} if attr in parts else {f"{k}.weight"}
    assert matrices == {"base_lm.embed_tokens.weight"} | kept_weights
    for n in report["quantized"]:
        mod, _, attr = n.rpartition(".")
        w = getattr(m.get_submodule(mod), attr)
        w = w.weight if isinstance(w, FP8Linear) else w
        assert isinstance(w, fp8.FP8Weight) and w.data.dtype == torch.float8_e4m3fn and w.dtype == torch.bfloat16
    # What reads a projection's weight for the model's dtype still gets it.
    assert m.fusion_concat_proj.weight.dtype == torch.bfloat16


def test_quantized_weights_are_the_originals_rounded(quantized):
    _, vox, report, before, fused, _ = quantized
    m = vox.model
    for n in report["quantized"]:
        mod, _, attr = n.rpartition(".")
        obj = getattr(m.get_submodule(mod), attr)
        w = obj.weight if isinstance(obj, FP8Linear) else obj
        orig = fused[mod] if attr == "qkv" else before.get(f"{n}.weight")
        if attr == "gate_up":
            orig = torch.cat([before[f"{mod}.gate_proj.weight"], before[f"{mod}.up_proj.weight"]])
        assert orig is not None, n
        o = orig.float()
        assert torch.all((w.dequantize().float() - o).abs()
                         <= rounding_bound(o, w.scale.t()) + o.abs() * 2 ** -8), n  # + the bf16 dequant rounding
        if isinstance(obj, FP8Linear) and f"{n}.bias" in before:
            assert torch.equal(obj.bias, before[f"{n}.bias"]), n
    # The parts of a fused group are views of its rows, under the official names.
    groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}
    checked = 0
    for mod in m.modules():
        for attr, parts in groups.items():
            w = getattr(mod, attr, None)
            if not isinstance(w, fp8.FP8Weight):
                continue
            start = 0
            for p in parts:
                part = getattr(mod, p)
                n = part.out_features
                assert part.weight.data.data_ptr() == w.data[start:start + n].data_ptr()
                assert torch.equal(part.weight.scale, w.scale[:, start:start + n])
                start += n
            assert start == w.data.shape[0]
            checked += 1
    assert checked > 0


def test_the_vae_is_untouched(quantized):
    _, vox, _, _, _, vae = quantized
    now = vox.vae.state_dict()
    assert set(now) == set(vae)
    for n, (ptr, t) in vae.items():
        assert now[n].data_ptr() == ptr and now[n].dtype == t.dtype and torch.equal(now[n], t), n
    assert next(vox.vae.parameters()).dtype == torch.float32


def test_precision_is_validated_with_a_clear_error(checkpoint_dirs):
    cpu = torch.device("cpu")
    assert resolve_precision("bf16", cpu, torch.float32) == "bf16"
    with pytest.raises(ValueError, match="precision must be one of bf16, fp8, got 'int8'"):
        resolve_precision("int8", cpu, torch.bfloat16)
    with pytest.raises(ValueError, match=r"precision='fp8': FP8 GEMMs need a CUDA GPU \(device is cpu\)"):
        resolve_precision("fp8", cpu, torch.bfloat16)
    with pytest.raises(ValueError, match="precision='fp8'"):
        VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cpu", precision="fp8")


# ---------------------------------------------------------------- GPU: the real kernel
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("M", [1, 2, 7, 64, 1408])
def test_scaled_mm_on_the_gpu_matches_the_emulation(M):
    # python3 -m pytest -q tests/test_fp8.py -k gpu   (on a GPU machine)
    if fp8.supported(torch.device("cuda")) is not None:
        pytest.fail(fp8.supported(torch.device("cuda")))
    dev = torch.device("cuda")
    for N, K in ((2560, 2048), (1024, 1024), (64, 1024), (8192, 1024)):  # LM QKV, LocDiT, out_proj, gate_up
        x = heavy_tailed(M, K, seed=M).to(dev, torch.bfloat16)
        w = fp8.quantize_weight((heavy_tailed(N, K, seed=N) / 16).to(dev, torch.bfloat16))
        bias = torch.randn(N, device=dev).to(torch.bfloat16)
        got = fp8.fp8_linear(x, w, bias)
        xq, sx = fp8.quantize_rows(x)
        want = fp8.emulated_scaled_mm(xq, w.data.t(), sx, w.scale, bias, torch.bfloat16)
        # Hopper's FP8 tensor cores accumulate with fewer mantissa bits than fp32, so a sum that
        # cancels can be off by a small fraction of the magnitudes it summed, not of its result;
        # plus the output's own bf16 rounding.
        err = (got.float() - want.float()).abs()
        summed = (xq.float().abs() @ w.data.float().abs().t()) * sx * w.scale
        bound = 2 ** -10 * summed + 2 ** -7 * want.float().abs() + 2e-3
        assert torch.all(err <= bound), (M, N, K, err.max().item(), (err / bound).max().item())
        assert got.float().abs().max() > 0.1
        col_major = x.t().contiguous().t()  # _scaled_mm takes only a row-major first operand
        assert torch.equal(fp8.fp8_linear(col_major, w, bias), got)
    # Compiled and captured in a CUDA graph, as the decode step runs it.
    f = torch.compile(fp8.linear, dynamic=True)
    static_x = x.clone()
    out = f(static_x, w, bias)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(static_x, w, bias)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        captured = f(static_x, w, bias)
    static_x.copy_(heavy_tailed(M, K, seed=99).to(dev, torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(captured.float(), fp8.fp8_linear(static_x, w, bias).float(), rtol=2 ** -7, atol=2e-3)
    assert out.shape == (M, N)
