"""AudioVAE V2: parity with the official voxcpm 2.0.3 module, checkpoint
round-trips, streaming decode, and input validation (all CPU, tiny configs)."""

import copy

import pytest
import torch

from tests.reference import voxcpm2_module

voxcpm2_module()  # installs the torchaudio placeholder before voxcpm imports

from voxcpm.modules.audiovae.audio_vae_v2 import AudioVAE as RefVAE  # noqa: E402
from voxcpm.modules.audiovae.audio_vae_v2 import AudioVAEConfig as RefCfg  # noqa: E402

from voxcpm_triton.model.audio_vae import AudioVAE, AudioVAEConfig, vae_state_dict_official  # noqa: E402

SMALL_DW = dict(
    encoder_dim=8,
    encoder_rates=[2, 3],
    latent_dim=8,
    decoder_dim=32,
    decoder_rates=[2, 2, 3],
    depthwise=True,
    sample_rate=16000,
    out_sample_rate=48000,
    sr_bin_boundaries=[20000, 30000, 40000],
)
SMALL_PLAIN = dict(
    encoder_dim=8,
    encoder_rates=[3, 2],
    latent_dim=8,
    decoder_dim=32,
    decoder_rates=[3, 2],
    depthwise=False,
    sample_rate=16000,
    out_sample_rate=24000,
    sr_bin_boundaries=None,
)
# Real rates, tiny channels.
REALISH = dict(
    encoder_dim=4,
    encoder_rates=[2, 5, 8, 8],
    latent_dim=8,
    decoder_dim=128,
    decoder_rates=[8, 6, 5, 2, 2, 2],
    depthwise=True,
    sr_bin_boundaries=[20000, 30000, 40000],
)
COND_ADD = dict(SMALL_DW, cond_type="add")
COND_CONCAT = dict(SMALL_DW, cond_type="concat", cond_dim=6, cond_out_layer=True, depthwise=False)
COND_SB_OUT = dict(SMALL_DW, cond_type="scale_bias_init", cond_out_layer=True)

PARITY_CONFIGS = {
    "small_dw": SMALL_DW,
    "small_plain": SMALL_PLAIN,
    "realish": REALISH,
    "cond_add": COND_ADD,
    "cond_concat": COND_CONCAT,
    "cond_sb_out": COND_SB_OUT,
}


def _randomize(ref: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere, so no layer is trivially the identity, but
    scaled so activations stay O(1) and the final tanh is not saturated."""
    g = torch.Generator().manual_seed(seed)

    def rnd(shape):
        return torch.randn(shape, generator=g)

    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("weight_g"):
                p.copy_(0.5 + 0.4 * torch.rand(p.shape, generator=g))
            elif name.endswith("weight_v"):
                p.copy_(rnd(p.shape))
            elif "scale_embed" in name:
                p.copy_(1.0 + 0.3 * rnd(p.shape))
            elif "bias_embed" in name or "cond_embed" in name:
                p.copy_(0.3 * rnd(p.shape))
            elif name.endswith("bias"):
                p.copy_(0.03 * rnd(p.shape))
            else:
                raise AssertionError(f"unhandled parameter {name}")


_CACHE = {}


def _pair(name):
    """(reference, ours) with the same random weights, loaded from the reference's state dict."""
    if name not in _CACHE:
        cfg = PARITY_CONFIGS[name]
        torch.manual_seed(0)
        ref = RefVAE(RefCfg(**cfg)).eval()
        _randomize(ref, seed=len(_CACHE) + 1)
        ours = AudioVAE(AudioVAEConfig.from_dict(cfg)).eval()
        ours.load_vae_state_dict(ref.state_dict())
        _CACHE[name] = (ref, ours)
    return _CACHE[name]


def _latents(vae, batch, frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vae.latent_dim, frames, generator=g)


# --------------------------------------------------------------------------- #
# Parity with the reference
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", list(PARITY_CONFIGS))
def test_decode_parity(name):
    ref, ours = _pair(name)
    z = _latents(ours, 2, 7)
    with torch.no_grad():
        if ours.config.cond_type == "concat":
            # The reference's concat path only broadcasts a per-row sr tensor.
            want = ref.decode(z, torch.tensor([ours.out_sample_rate] * 2, dtype=torch.int32))
        else:
            want = ref.decode(z)
    got = ours.decode(z)
    assert got.shape == (2, 1, 7 * ours.decode_chunk_size) == want.shape
    # Not saturated / degenerate, so the comparison means something.
    assert want.abs().max() < 0.999 and want.std() > 1e-2
    other = ours.decode(_latents(ours, 2, 7, seed=9))
    assert (other - got).abs().mean() > 0.2 * got.abs().mean()  # the audio depends on the latents
    assert (got - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", ["small_dw", "realish", "cond_concat"])
def test_decode_parity_explicit_sample_rate(name):
    ref, ours = _pair(name)
    z = _latents(ours, 2, 5, seed=1)
    for sr in (16000, 24000, 44100):
        with torch.no_grad():
            want = ref.decode(z, torch.tensor([sr, sr], dtype=torch.int32))
            if ours.config.cond_type != "concat":  # the reference's concat needs a per-row tensor
                assert torch.equal(want, ref.decode(z, torch.tensor([sr], dtype=torch.int32)))
        assert (ours.decode(z, sr) - want).abs().max().item() <= 1e-4
        assert (ours.decode(z, torch.tensor([sr, sr])) - want).abs().max().item() <= 1e-4
    # Different rates in one batch == each row decoded alone.
    rows = ours.decode(z, torch.tensor([16000, 48000]))
    assert (rows[0:1] - ours.decode(z[0:1], 16000)).abs().max().item() <= 1e-5
    assert (rows[1:2] - ours.decode(z[1:2], 48000)).abs().max().item() <= 1e-5
    # The reference buckets, so rates in one bucket give identical audio.
    assert torch.equal(ours.decode(z, 41000), ours.decode(z, 48000))


@pytest.mark.parametrize("name", ["small_dw", "small_plain", "realish"])
def test_encode_parity(name):
    ref, ours = _pair(name)
    hop = ours.chunk_size
    g = torch.Generator().manual_seed(3)
    audio = 0.5 * torch.randn(2, 5 * hop + hop // 2 + 1, generator=g)  # not a whole number of hops
    with torch.no_grad():
        want = ref.encode(audio, ours.sample_rate)
    got = ours.encode(audio)
    assert got.shape == (2, ours.latent_dim, 6) == want.shape
    assert want.abs().max() > 1e-2
    assert (got - want).abs().max().item() <= 1e-4
    assert (ours.encode(audio.unsqueeze(1), ours.sample_rate) - got).abs().max().item() == 0
    with pytest.raises(ValueError, match="Hz"):
        ours.encode(audio, ours.sample_rate + 1)


def test_attributes():
    _, ours = _pair("realish")
    assert ours.sample_rate == 16000 and ours.out_sample_rate == 48000
    assert ours.latent_dim == 8
    assert ours.chunk_size == 640
    assert ours.decode_chunk_size == 1920  # 48 kHz / 25 Hz


def test_default_config_matches_reference():
    ours, ref = AudioVAEConfig(), RefCfg()
    assert ours.to_dict() == ref.model_dump()


def test_real_config_state_dict_layout_matches_reference():
    # Full-size default config, built on the meta device (no memory, no init cost).
    with torch.device("meta"):
        ref = RefVAE()
        ours = AudioVAE()
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in vae_state_dict_official(ours).items()}
    assert got == want
    assert ours.chunk_size == 640 and ours.decode_chunk_size == 1920


def test_zero_weight_slice_exports_finite():
    _, ours = _pair("small_plain")
    other = copy.deepcopy(ours)
    with torch.no_grad():
        other.encoder.fc_mu.weight[0].zero_()
    sd = vae_state_dict_official(other)
    assert torch.isfinite(sd["encoder.fc_mu.weight_v"]).all()
    back = AudioVAE.from_state_dict(sd, other.config)
    assert torch.equal(back.encoder.fc_mu.weight[0], torch.zeros_like(back.encoder.fc_mu.weight[0]))


# --------------------------------------------------------------------------- #
# Checkpoint formats
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", ["small_dw", "small_plain", "cond_concat"])
def test_official_state_dict_loads_into_reference(name):
    ref, ours = _pair(name)
    sd = vae_state_dict_official(ours)
    assert any(k.endswith("weight_g") for k in sd) and not any(k.endswith(".weight") and "embed" not in k for k in sd)
    fresh = RefVAE(RefCfg(**PARITY_CONFIGS[name])).eval()
    fresh.load_state_dict(sd, strict=True)
    z = _latents(ours, 1, 6, seed=5)
    with torch.no_grad():
        want = fresh.decode(z)
        audio = 0.5 * torch.randn(1, 4 * ours.chunk_size)
        enc_want = fresh.encode(audio, ours.sample_rate)
    assert (ours.decode(z) - want).abs().max().item() <= 1e-4
    assert (ours.encode(audio) - enc_want).abs().max().item() <= 1e-4


def test_plain_and_official_round_trip():
    _, ours = _pair("small_dw")
    cfg = ours.config
    plain = AudioVAE.from_state_dict(ours.state_dict(), cfg)
    official = AudioVAE.from_state_dict(vae_state_dict_official(ours), cfg)
    z = _latents(ours, 1, 4)
    want = ours.decode(z)
    assert torch.equal(plain.decode(z), want)
    assert (official.decode(z) - want).abs().max().item() <= 1e-5
    # torch.load(...)-style {"state_dict": ...} wrapper is accepted too.
    AudioVAE(cfg).load_vae_state_dict({"state_dict": vae_state_dict_official(ours)})


def test_parametrizations_weight_norm_form_loads():
    ref, ours = _pair("small_plain")
    sd = {}
    for k, v in ref.state_dict().items():
        k = k.replace("weight_g", "parametrizations.weight.original0")
        k = k.replace("weight_v", "parametrizations.weight.original1")
        sd[k] = v
    other = AudioVAE.from_state_dict(sd, ours.config)
    z = _latents(ours, 1, 3)
    assert torch.equal(other.decode(z), ours.decode(z))


def test_sr_bin_boundaries_buffer_optional_but_checked():
    _, ours = _pair("small_dw")
    sd = vae_state_dict_official(ours)
    del sd["decoder.sr_bin_boundaries"]
    AudioVAE(ours.config).load_vae_state_dict(sd)
    sd["decoder.sr_bin_boundaries"] = torch.tensor([1, 2, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="decoder.sr_bin_boundaries"):
        AudioVAE(ours.config).load_vae_state_dict(sd)


def _official(name="small_dw"):
    return vae_state_dict_official(_pair(name)[1]), _pair(name)[1].config


@pytest.mark.parametrize(
    "key", ["decoder.model.0.weight_g", "decoder.model.0.weight_v", "encoder.fc_mu.bias", "decoder.model.2.block.0.alpha"]
)
def test_missing_key_raises(key):
    sd, cfg = _official()
    del sd[key]
    with pytest.raises(ValueError, match="missing.*" + key.replace(".", r"\.")):
        AudioVAE(cfg).load_vae_state_dict(sd)


def test_missing_plain_weight_raises():
    _, ours = _pair("small_dw")
    sd = ours.state_dict()
    del sd["encoder.fc_logvar.weight"]
    with pytest.raises(ValueError, match=r"encoder\.fc_logvar\.weight"):
        AudioVAE(ours.config).load_vae_state_dict(sd)


def test_unexpected_key_raises():
    sd, cfg = _official()
    sd["decoder.model.99.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"unexpected.*decoder\.model\.99\.weight"):
        AudioVAE(cfg).load_vae_state_dict(sd)
    # A checkpoint with sr conditioning does not fit a config without it.
    sd, _ = _official()
    no_sr = AudioVAEConfig.from_dict(dict(SMALL_DW, sr_bin_boundaries=None))
    with pytest.raises(ValueError, match=r"unexpected.*sr_cond_model"):
        AudioVAE(no_sr).load_vae_state_dict(sd)


def test_both_forms_for_one_weight_raise():
    sd, cfg = _official()
    sd["encoder.fc_mu.weight"] = torch.zeros(8, 32, 3)
    with pytest.raises(ValueError, match=r"encoder\.fc_mu\.weight"):
        AudioVAE(cfg).load_vae_state_dict(sd)


@pytest.mark.parametrize(
    "key", ["encoder.fc_mu.weight_v", "encoder.fc_mu.weight_g", "decoder.model.2.block.1.bias", "encoder.block.0.bias"]
)
def test_wrong_shape_raises(key):
    sd, cfg = _official()
    sd[key] = torch.zeros(*sd[key].shape[:-1], sd[key].shape[-1] + 1)
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + ".*expected shape"):
        AudioVAE(cfg).load_vae_state_dict(sd)


def test_wrong_shape_plain_raises():
    _, ours = _pair("small_dw")
    sd = ours.state_dict()
    sd["decoder.model.0.weight"] = torch.zeros(3, 3, 3)
    with pytest.raises(ValueError, match=r"decoder\.model\.0\.weight"):
        AudioVAE(ours.config).load_vae_state_dict(sd)


# --------------------------------------------------------------------------- #
# Streaming
# --------------------------------------------------------------------------- #

CHUNKS = [1, 2, 3, 8]


def _stream(vae, z, sizes, state=None, sr=None):
    state = vae.new_stream_state(z.shape[0]) if state is None else state
    outs, t = [], 0
    for n in sizes:
        a, state = vae.decode_chunk(z[..., t : t + n], state, sr)
        assert a.shape[-1] == n * vae.decode_chunk_size
        outs.append(a)
        t += n
    return torch.cat(outs, dim=-1), state


@pytest.mark.parametrize("name", ["small_dw", "small_plain", "realish", "cond_concat"])
def test_streaming_matches_one_shot(name):
    _, ours = _pair(name)
    z = _latents(ours, 2, sum(CHUNKS), seed=7)
    want = ours.decode(z)
    for sizes in (CHUNKS, CHUNKS[::-1], [1] * sum(CHUNKS)):
        got, _ = _stream(ours, z, sizes)
        assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["small_dw", "realish"])
def test_streaming_matches_reference_streaming(name):
    ref, ours = _pair(name)
    z = _latents(ours, 1, sum(CHUNKS), seed=8)
    outs, t = [], 0
    with torch.no_grad(), ref.streaming_decode() as dec:
        for n in CHUNKS:
            outs.append(dec.decode_chunk(z[..., t : t + n]))
            t += n
    want = torch.cat(outs, dim=-1)
    got, _ = _stream(ours, z, CHUNKS)
    assert (got - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", ["small_dw", "realish"])
def test_batched_streams_stack_and_split(name):
    """Three streams at different positions, decoded alone and with their states stacked along dim 0."""
    _, ours = _pair(name)
    srs = [48000, 16000, 24000]
    zs = [_latents(ours, 1, 16, seed=10 + i) for i in range(3)]
    wants = [ours.decode(z, sr) for z, sr in zip(zs, srs)]

    # Each stream starts alone with its own prefix length (0, 1, 2 frames).
    pos, states, outs = [], [], []
    for i, (z, sr) in enumerate(zip(zs, srs)):
        st = ours.new_stream_state()
        a, st = ours.decode_chunk(z[..., :i], st, sr)
        pos.append(i), states.append(st), outs.append([a])

    # Then together: chunks of equal length decoded in one batched call.
    sr_batch = torch.tensor(srs)
    for n in (3, 8, 2):
        batch_state = [torch.cat(ts) for ts in zip(*states)]
        z_batch = torch.cat([z[..., p : p + n] for z, p in zip(zs, pos)], dim=0)
        audio, batch_state = ours.decode_chunk(z_batch, batch_state, sr_batch)
        states = [[t[i : i + 1] for t in batch_state] for i in range(3)]
        for i in range(3):
            outs[i].append(audio[i : i + 1])
            pos[i] += n

    # And alone again to the end.
    for i, (z, sr) in enumerate(zip(zs, srs)):
        a, states[i] = ours.decode_chunk(z[..., pos[i] :], states[i], sr)
        outs[i].append(a)
        got = torch.cat(outs[i], dim=-1)
        assert got.shape == wants[i].shape
        assert (got - wants[i]).abs().max().item() <= 1e-5


def test_fresh_state_and_input_state_untouched():
    _, ours = _pair("small_dw")
    st = ours.new_stream_state(2)
    assert all(t.abs().sum() == 0 for t in st)
    assert [tuple(t.shape[1:]) for t in st] == ours.stream_state_spec()
    before = copy.deepcopy(st)
    z = _latents(ours, 2, 3)
    a1, _ = ours.decode_chunk(z, st)
    assert all(torch.equal(x, y) for x, y in zip(st, before))
    a2, _ = ours.decode_chunk(z, st)  # replaying from the same state is deterministic
    assert torch.equal(a1, a2)
    empty, st2 = ours.decode_chunk(z[..., :0], st)
    assert empty.shape == (2, 1, 0) and all(torch.equal(x, y) for x, y in zip(st, st2))


def test_prime_continuation():
    _, ours = _pair("realish")
    z = _latents(ours, 1, 12, seed=4)
    hop = ours.decode_chunk_size
    want = ours.decode(z)
    st = ours.prime(ours.new_stream_state(), z[..., :3])
    got, _ = _stream(ours, z[..., 3:], [2, 1, 6], state=st)
    assert (got - want[..., 3 * hop :]).abs().max().item() <= 1e-5


def test_vae_streams_slot_pool_matches_one_shot():
    """VAEStreams: streams at different positions, in changing batches and orders, one
    restarted and one primed with context, each equal to decoding its latents in one go."""
    from voxcpm_triton.audio.vae_streams import StreamSlotsFull, VAEStreams

    _, ours = _pair("realish")
    hop, P = ours.decode_chunk_size, 2
    streams = VAEStreams(ours, patch_size=P, max_streams=3)
    zs = {k: _latents(ours, 1, 12, seed=20 + k) for k in (1, 2, 3)}
    ctx = _latents(ours, 1, 3, seed=30)
    pos = {k: 0 for k in zs}
    got = {k: [] for k in zs}

    def step(keys, n):
        audio = streams.decode(keys, torch.cat([zs[k][..., pos[k] : pos[k] + n] for k in keys]))
        assert audio.shape == (len(keys), n * hop)
        for k, a in zip(keys, audio):
            got[k].append(a)
            pos[k] += n

    streams.open(1)
    streams.open(2)
    step([1, 2], 2)
    streams.open(3, context=ctx)
    step([3, 1], 2)
    step([2], 4)
    step([1, 2, 3], 1)
    step([3], 7)
    step([2, 1], 5)
    step([1, 3], 2)
    assert set(pos.values()) == {12} and len(streams) == 3
    for k, z in zs.items():
        want = ours.decode(z if k != 3 else torch.cat([ctx, z], -1))[0, 0]
        want = want[ctx.shape[-1] * hop :] if k == 3 else want
        assert (torch.cat(got[k]) - want).abs().max().item() <= 1e-5, k

    # A full pool refuses a new stream; a closed slot is reused from silence; open() restarts.
    with pytest.raises(StreamSlotsFull, match="3 VAE stream slots"):
        streams.open(4)
    streams.close(1)
    streams.open(4)
    streams.open(2)
    first = streams.decode([4, 2], torch.cat([zs[1][..., :3], zs[2][..., :3]]))
    want = ours.decode(torch.cat([zs[1][..., :3], zs[2][..., :3]]))[:, 0]
    assert (first - want).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="at most once"):
        streams.decode([4, 4], torch.cat([zs[1][..., :1]] * 2))

    # Batches of other streams queued before either result (as vae_decoder runs its batches).
    a, b = streams.decode_async([4], zs[1][..., 3:5]), streams.decode_async([2], zs[2][..., 3:9])
    for audio, z in ((a.result(), zs[1]), (b.result(), zs[2])):
        want = ours.decode(z[..., :3 + audio.shape[-1] // hop])[0, 0, 3 * hop:]
        assert (audio[0] - want).abs().max().item() <= 1e-5


def test_state_batch_mismatch_raises():
    _, ours = _pair("small_dw")
    with pytest.raises(ValueError, match="stream state"):
        ours.decode_chunk(_latents(ours, 2, 2), ours.new_stream_state(1))
    with pytest.raises(ValueError, match="stream state"):
        ours.decode_chunk(_latents(ours, 1, 2), ours.new_stream_state(1)[:-1])


# --------------------------------------------------------------------------- #
# Config validation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "update, field",
    [
        ({"encoder_dim": 0}, "encoder_dim"),
        ({"latent_dim": -4}, "latent_dim"),
        ({"decoder_dim": 2.0}, "decoder_dim"),
        ({"decoder_dim": 4}, "decoder_dim"),  # 3 halvings of 4 channels leave none
        ({"sample_rate": True}, "sample_rate"),
        ({"out_sample_rate": 0}, "out_sample_rate"),
        ({"cond_dim": 0}, "cond_dim"),
        ({"encoder_rates": [2, 0]}, "encoder_rates"),
        ({"encoder_rates": []}, "encoder_rates"),
        ({"decoder_rates": [2, -3]}, "decoder_rates"),
        ({"decoder_rates": "23"}, "decoder_rates"),
        ({"depthwise": "yes"}, "depthwise"),
        ({"use_noise_block": True}, "use_noise_block"),
        ({"sr_bin_boundaries": [30000, 20000]}, "sr_bin_boundaries"),
        ({"sr_bin_boundaries": []}, "sr_bin_boundaries"),
        ({"cond_type": "film"}, "cond_type"),
        ({"cond_type": "concat", "cond_out_layer": False}, "cond_out_layer"),
        ({"bogus_field": 1}, "bogus_field"),
    ],
)
def test_bad_config_raises(update, field):
    with pytest.raises(ValueError, match=field):
        AudioVAEConfig.from_dict(dict(SMALL_DW, **update))


def test_config_from_dict_round_trip():
    cfg = AudioVAEConfig.from_dict(dict(SMALL_DW, encoder_rates=(2, 3)))
    assert cfg.encoder_rates == [2, 3]
    assert AudioVAEConfig.from_dict(cfg.to_dict()) == cfg
    assert AudioVAE(cfg.to_dict()).config == cfg


def test_vae_streams_cover_a_length_without_a_graph_with_graph_pieces():
    """The decomposition a GPU uses for chunk lengths with no graph (tests/test_engine_gpu.py
    decodes through it): graph lengths of the batch's bucket, longest first; eager (None) past the
    longest or where they cannot cover it. Only the captured lengths' keys matter here."""
    from voxcpm_triton.audio.vae_streams import VAEStreams

    _, ours = _pair("realish")
    streams = VAEStreams(ours, patch_size=2, max_streams=4)
    streams.graphs = {(b, n): object() for b in (1, 2) for n in (2, 8, 32)}
    assert streams.pieces(2, 30) == [8, 8, 8, 2, 2, 2] and streams.pieces(1, 32) == [32]
    assert streams.pieces(2, 34) is None and streams.pieces(3, 8) is None
    assert streams.pieces(2, 70, past_longest=True) == [32, 32, 2, 2, 2]  # what closed_loop.py's long_pieces takes
    assert streams.pieces(2, 33, past_longest=True) is None
    streams.graphs = {(1, 8): object()}
    assert streams.pieces(1, 6) is None
