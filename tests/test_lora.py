"""LoRA adapters on the CPU in fp32: adapters written by the official voxcpm 2.0.3 give its results
(offline API), rows of one batch on different adapters give their solo results (engine), loading
is strict, and adapters come and go at run time without disturbing running requests."""

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.lora_helpers import ADAPTERS, write_adapters
from tests.test_model_parity import TOL, _mode_inputs, _run_reference, maxdiff
from voxcpm_triton import VoxCPM2
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished
from voxcpm_triton.engine.lora_registry import LoraFull, LoraRegistry
from voxcpm_triton.formats import lora as lora_format
from voxcpm_triton.formats.lora import LoraError, load_adapter, load_dir
from voxcpm_triton.model import lora as lora_model
from voxcpm_triton.model.lora import LoraOp, LoraTables, lora_delta, linear_shapes, sites_for
from voxcpm_triton.model.noise import noise_for_steps

TIMEOUT = 120


@pytest.fixture(scope="module")
def ckpt(checkpoint_dirs):
    return checkpoint_dirs["real_shaped"]


@pytest.fixture(scope="module")
def lora_dir(ckpt, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("loras"))
    refs = write_adapters(ckpt, d)
    return d, refs


@pytest.fixture(scope="module")
def vox(ckpt, lora_dir):
    return VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=lora_dir[0])


def test_every_adapter_loads_with_its_config(vox):
    assert vox.loras.errors == {}
    assert sorted(vox.loras.slots) == sorted(ADAPTERS)
    assert vox.loras.tables.max_rank == max(c["r"] for c, _, _ in ADAPTERS.values())


@torch.inference_mode()
@pytest.mark.parametrize("name, mode", [("lm_dit", "zero_shot"), ("everything", "combined")])
def test_generate_latents_matches_reference_with_adapter(vox, lora_dir, name, mode, tmp_path):
    ref = lora_dir[1][name]
    text, kw, cache = _mode_inputs(mode, vox, tmp_path)
    steps = 12
    noise = noise_for_steps(5, steps, (vox.feat_dim, vox.patch_size))
    gen = dict(min_len=steps, max_len=steps, cfg_value=2.0, inference_timesteps=6)
    want, _ = _run_reference(ref, text, cache, noise, **gen)
    got = vox.generate_latents(text, noise=noise, lora=name, **gen, **kw)
    assert got.shape == want.shape
    assert maxdiff(got, want) <= TOL
    # The adapter does change the result: the check above is not the base model's.
    base = vox.generate_latents(text, noise=noise, **gen, **kw)
    assert maxdiff(got, base) > 100 * TOL


def test_unknown_adapter_is_an_error(vox):
    with pytest.raises(ValueError, match=r"unknown LoRA adapter 'nope' \(loaded: everything, lm_dit, lm_mlp_proj\)"):
        vox.generate_latents("Hi.", lora="nope", max_len=2)
    assert vox.generate_latents("Hi.", lora="", seed=1, max_len=3).shape[0] == 3  # empty: the base model


def _prompt(vox, i):
    rate = vox.encode_sample_rate
    from tests.conftest import sine_wave

    texts = ["One for the first adapter.", "Two, a longer line for the second one to say.", "Three.", "Four, base."]
    kw = {}
    if i == 1:
        kw = dict(reference_audio=sine_wave(0.4, rate, 200.0, 1), reference_sample_rate=rate)
    return vox.prepare_prompt(texts[i], **kw)


@pytest.mark.parametrize("dit_token_rows", [8, 0, "kernel"], ids=["dit_token", "dit_group", "kernel"])
def test_mixed_batch_of_three_adapters_and_the_base_equals_solo_runs(vox, monkeypatch, dit_token_rows):
    """Four requests decoding together, each row on its own adapter (or none): each equals its solo
    offline run, with LocDiT's LoRA in either torch formulation (the solo runs use "token"), or every
    decode op in the Triton kernel (`kernels.lora`, under the interpreter here), solo runs too."""
    if dit_token_rows == "kernel":
        monkeypatch.setattr(vox.loras.tables, "kernel", True)
    else:
        monkeypatch.setattr(lora_model, "DIT_TOKEN_MAX_ROWS", dit_token_rows)
    names = ["lm_dit", "everything", "lm_mlp_proj", None]
    prompts = [_prompt(vox, i) for i in range(4)]
    gen = dict(min_len=6, max_len=6, inference_timesteps=5)
    if dit_token_rows == "kernel":  # the interpreter is slow: fewer steps
        gen = dict(min_len=3, max_len=3, inference_timesteps=2)
    eng = Engine(vox, EngineConfig(num_blocks=128, block_size=4, max_num_seqs=8, enable_prefix_caching=False))
    try:
        handles = [eng.submit(EngineRequest(f"r{i}", p, seed=20 + i, lora=n, **gen))
                   for i, (p, n) in enumerate(zip(prompts, names))]
        results = [h.result(timeout=TIMEOUT) for h in handles]
        assert max(eng.stats()["batch_sizes"]) == 4
    finally:
        eng.shutdown()
    for (got, fin), p, n, i in zip(results, prompts, names, range(4)):
        assert fin.error is None, fin.error
        want = vox.generate_latents(None, prompt=p, seed=20 + i, lora=n, **gen)
        assert got.shape == want.shape and maxdiff(got, want) <= TOL, n


def test_rows_on_one_adapter_run_it_merged_and_the_weights_come_back(vox):
    """Steps whose rows all run on one adapter run the plain network over it merged into the
    weights (EngineConfig.lora_merge). A request on that adapter arriving meanwhile is prefilled on
    the merged weights without its LoRA ops; a base request arriving takes the adapter out (each
    row's LoRA ops for the mixed steps), and it goes back in once that one has ended. Every request
    equals its offline run, and the weights are exactly as loaded whenever the engine has nothing to
    run, shutdown included."""
    p_a, p_b = _prompt(vox, 0), _prompt(vox, 2)
    long = dict(min_len=12, max_len=12, inference_timesteps=3)
    short = dict(min_len=3, max_len=3, inference_timesteps=3)
    want_a = vox.generate_latents(None, prompt=p_a, seed=1, lora="lm_dit", **long)
    want_a2 = vox.generate_latents(None, prompt=p_b, seed=3, lora="lm_dit", **long)
    want_b = vox.generate_latents(None, prompt=p_b, seed=2, **short)
    loaded = {k: v.clone() for k, v in vox.model.state_dict().items()}

    def as_loaded():
        return all(torch.equal(v, loaded[k]) for k, v in vox.model.state_dict().items())

    eng = Engine(vox, EngineConfig(num_blocks=128, block_size=4, max_num_seqs=4))
    slot = vox.loras.slots["lm_dit"]
    states, prefills, launch, for_prefill = [], [], eng.runner.launch, eng.lora_merging.for_prefill

    def spy(rows, bucket=None, plain=False):  # (rows' slots, plain, merged adapter) per launch
        state = (frozenset(r[9] for r in rows), plain, eng.merged.slot)
        if not states or states[-1] != state:
            states.append(state)
        return launch(rows, bucket, plain)

    def spy_prefill(s):  # (the prompts' adapter, merged before, the LoRA slot the prefill runs)
        merged = eng.merged.slot
        prefills.append((s, merged, for_prefill(s)))
        return prefills[-1][2]

    eng.runner.launch, eng.lora_merging.for_prefill = spy, spy_prefill
    try:
        gate = threading.Event()
        sink = _gated(gate)  # holds the engine at a's first chunk: a2 and b are submitted meanwhile
        eng.submit(EngineRequest("a", p_a, seed=1, lora="lm_dit", **long), sink=sink)
        assert sink.entered.wait(TIMEOUT)
        handle_a2 = eng.submit(EngineRequest("a2", p_b, seed=3, lora="lm_dit", **long))
        handle_b = eng.submit(EngineRequest("b", p_b, seed=2, **short))
        gate.set()
        got_b, fin_b = handle_b.result(timeout=TIMEOUT)
        got_a2, fin_a2 = handle_a2.result(timeout=TIMEOUT)
        got_a, fin_a = _collect(sink)
        assert fin_a.error is None and fin_a2.error is None and fin_b.error is None
        assert maxdiff(got_a, want_a) <= TOL and maxdiff(got_a2, want_a2) <= TOL and maxdiff(got_b, want_b) <= TOL
        # a: prefilled with its ops; a2: on the merged weights, without; b: the adapter taken out first
        assert prefills == [(slot, 0, slot), (slot, slot, 0), (0, slot, 0)]
        assert states == [({slot}, True, slot), ({slot, 0}, False, 0), ({slot}, True, slot)]
        assert eng.merged.slot == 0 and as_loaded() and eng.stats()["lora_merges"] == 2

        # base rows alone: the plain network, nothing merged
        states.clear()
        got_b, _ = eng.submit(EngineRequest("b2", p_b, seed=2, **short)).result(timeout=TIMEOUT)
        assert maxdiff(got_b, want_b) <= TOL and states == [({0}, True, 0)]

        # shut down with the adapter merged and a request running on it
        gate2 = threading.Event()
        sink2 = _gated(gate2)
        eng.submit(EngineRequest("c", p_a, seed=1, lora="lm_dit", min_len=200, max_len=200), sink=sink2)
        for _ in range(int(TIMEOUT / 0.01)):
            if eng.merged.slot == slot:
                break
            time.sleep(0.01)
        assert eng.merged.slot == slot
        gate2.set()
        eng.shutdown()
        events = [sink2.queue.get(timeout=TIMEOUT) for _ in range(sink2.queue.qsize())]
        assert isinstance(events[-1], Finished) and events[-1].reason == "error" and not eng._thread.is_alive()
        assert eng.merged.slot == 0 and as_loaded()
    finally:
        gate.set()
        eng.shutdown()


def test_lora_merge_off_runs_every_step_with_lora_ops(vox):
    eng = Engine(vox, EngineConfig(num_blocks=64, block_size=4, lora_merge=False))
    try:
        assert eng.merged is None and eng.runner.plain_graphs is None
        got, fin = eng.submit(EngineRequest("a", _prompt(vox, 0), seed=1, lora="lm_dit", min_len=3, max_len=3,
                                            inference_timesteps=3)).result(timeout=TIMEOUT)
        want = vox.generate_latents(None, prompt=_prompt(vox, 0), seed=1, lora="lm_dit", min_len=3, max_len=3,
                                    inference_timesteps=3)
        assert fin.error is None and maxdiff(got, want) <= TOL
    finally:
        eng.shutdown()


def test_token_and_group_formulations_agree():
    """Both ways of applying a fused site's LoRA, over CFG halves, rows on different slots (and the
    base slot 0), against a plain per-token loop."""
    g = torch.Generator().manual_seed(0)
    linears = {"m.self_attn.q_proj": (12, 8), "m.self_attn.k_proj": (12, 4), "m.self_attn.v_proj": (12, 4)}
    site = sites_for(linears, ["m.self_attn.q_proj", "m.self_attn.v_proj"])
    assert [s.name for s in site] == ["m.self_attn.qkv"] and site[0].splits == (8, 4, 4)
    t = LoraTables(site, max_loras=3, max_rank=4, dtype=torch.float32, device="cpu")
    weights = {}
    for slot, r in ((1, 4), (2, 2), (3, 3)):
        w = {m: (torch.randn(r, 12, generator=g), torch.randn(o, r, generator=g))
             for m, (_, o) in linears.items() if not (slot == 2 and m.endswith("k_proj"))}
        t.write(slot, w, scale=0.5 * slot)
        weights[slot] = w
    rows, halves, T = torch.tensor([2, 0, 3, 1]), 2, 3
    x = torch.randn(halves * len(rows) * T, 12, generator=g)
    want = torch.zeros(x.size(0), 16)
    for i in range(x.size(0)):  # token i is in row (i // T) % G of its block
        slot = int(rows[(i // T) % len(rows)])
        parts = []
        for m, (_, o) in linears.items():
            ab = weights.get(slot, {}).get(m)
            parts.append(x[i] @ ab[0].T @ ab[1].T * 0.5 * slot if ab is not None else torch.zeros(o))
        want[i] = torch.cat(parts)
    s = site[0].name
    token = lora_delta(x, LoraOp("token", t.a[s], t.b[s], rows, t.seg[s], site[0].splits, halves))
    group = lora_delta(x, LoraOp("group", t.a[s], t.b[s], rows, None, site[0].splits, halves))
    gathered = lora_delta(x, LoraOp("group", t.a[s][rows], t.b[s][rows], None, None, site[0].splits, halves))
    for got in (token, group, gathered):
        assert (got - want).abs().max().item() <= 1e-5


# ---------------------------------------------------------------- strict loading
@pytest.fixture(scope="module")
def linears(vox):
    return vox.loras.linears


def test_a_cfm_loops_time_embeddings_at_once_equal_each_steps(vox, linears):
    """`CFMSolver.time_embeddings`: the time MLP over every step of a loop in one product, rows on
    different adapters of it (token, group and kernel ops over 2S halves) and a base row, against each step's
    embedding of its CFG batch (2 halves), as `velocity` was given it one step at a time."""
    dec, g = vox.model.feat_decoder, torch.Generator().manual_seed(0)
    names = [f"{lora_model.DIT}.time_mlp.linear_1", f"{lora_model.DIT}.time_mlp.linear_2"]
    sites = sites_for(linears, names)
    t = LoraTables(sites, max_loras=2, max_rank=4, dtype=torch.float32, device="cpu")
    for slot, r in ((1, 4), (2, 2)):
        t.write(slot, {m: (torch.randn(r, linears[m][0], generator=g), torch.randn(linears[m][1], r, generator=g))
                       for m in names}, scale=0.5 * slot)
    kt = LoraTables(sites, max_loras=2, max_rank=4, dtype=torch.float32, device="cpu", kernel=True)
    assert kt.kernel  # the Triton kernel, under the interpreter here
    for slot in (1, 2):
        for s in sites:
            kt.a[s.name][slot], kt.b[s.name][slot] = t.a[s.name][slot], t.b[s.name][slot]
    rows, S = torch.tensor([2, 0, 1]), 4
    times = torch.rand(len(rows), S, generator=g)  # [B, S]: the schedule's columns
    for mode, tables in (("token", t), ("group", t), ("kernel", kt)):
        top = {s.name.removeprefix(f"{lora_model.DIT}."):
               LoraOp(mode, tables.a[s.name], tables.b[s.name], rows, None, s.splits, 2) for s in sites}
        lora = lora_model.DitLora(top, None)
        got = dec.time_embeddings(times, torch.float32, lora)
        assert got.shape == (S, 2 * len(rows), dec.estimator.hidden)
        ops = (top["time_mlp.linear_1"], top["time_mlp.linear_2"])
        for i in range(S):
            want = dec.estimator.time_embedding(torch.cat([times[:, i], times[:, i]]), torch.float32, ops)
            assert (got[i] - want).abs().max().item() <= 1e-6 * want.abs().max().item(), (mode, i)  # fp32 rounding
        plain = dec.estimator.time_embedding(torch.cat([times[:, 1], times[:, 1]]), torch.float32)
        assert (got[1] - plain).abs().max().item() > 1e-3  # the adapters change it


def _write(folder, tensors, config=None, name="lora_weights.safetensors"):
    os.makedirs(folder, exist_ok=True)
    if name.endswith(".safetensors"):
        save_file(tensors, os.path.join(folder, name))
    else:
        torch.save({"state_dict": tensors}, os.path.join(folder, name))
    if config is not None:
        with open(os.path.join(folder, "lora_config.json"), "w") as f:
            json.dump(config, f) if not isinstance(config, str) else f.write(config)
    return folder


def _pair(n_in, n_out, r, value=0.01):
    return torch.full((r, n_in), value), torch.full((n_out, r), value)


Q = "base_lm.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("case, message", [
    ("unknown_layer", r"unknown key\(s\) for base_lm\.layers\.99\.self_attn\.q_proj: no such linear layer"),
    ("untargeted", r"unknown key\(s\) for stop_head: not a target of this adapter's LoRAConfig "
                   r"\(enable_lm=True, enable_dit=True, enable_proj=False"),
    ("not_lora", r"unknown key\(s\) base_lm\.layers\.0\.self_attn\.q_proj\.weight: a LoRA file holds only"),
    ("shape_a", r"tensor base_lm\.layers\.0\.self_attn\.q_proj\.lora_A has shape \[8, 63\], expected \[r, 64\]"),
    ("shape_b", r"tensor base_lm\.layers\.0\.self_attn\.q_proj\.lora_B has shape \[64, 4\], expected \[64, 8\]"),
    ("rank", r"rank 64 is above the largest rank allowed, 32 \(parameter max_lora_rank\)"),
    ("ranks", r"tensors of different ranks"),
    ("half", r"'base_lm\.layers\.0\.self_attn\.q_proj\.lora_A' has no matching lora_B"),
    ("json_r", r"lora_config\.json says r=4 but the tensors have rank 8"),
    ("json_field", r"lora_config\.json: unknown field\(s\) \['rank'\]"),
    ("json_type", r"lora_config\.json: enable_lm must be true or false, got 'yes'"),
    ("json_bad", r"lora_config\.json: cannot read"),
    ("nan", r"inf/nan values: base_lm\.layers\.0\.self_attn\.q_proj\.lora_B"),
    ("alpha_overflow", r"base_lm\.layers\.0\.self_attn\.q_proj\.lora_B times alpha / r \(1e\+308 / 8\) overflows"),
    ("b_overflow", r"base_lm\.layers\.0\.self_attn\.q_proj\.lora_B times alpha / r \(16 / 8\) overflows float32"),
    ("no_file", r"no LoRA weights \(expected lora_weights\.safetensors or lora_weights\.ckpt\)"),
    ("empty", r"holds no tensors"),
])
def test_strict_loading_names_what_is_wrong(linears, tmp_path, case, message):
    d = str(tmp_path / "ad")
    a, b = _pair(64, 64, 8)
    t, cfg = {f"{Q}.lora_A": a, f"{Q}.lora_B": b}, None
    if case == "unknown_layer":
        t = {k.replace("layers.0", "layers.99"): v for k, v in t.items()}
    elif case == "untargeted":
        t["stop_head.lora_A"], t["stop_head.lora_B"] = _pair(64, 2, 8)
    elif case == "not_lora":
        t[f"{Q}.weight"] = torch.zeros(64, 64)
    elif case == "shape_a":
        t[f"{Q}.lora_A"] = torch.zeros(8, 63)
    elif case == "shape_b":
        t[f"{Q}.lora_B"] = torch.zeros(64, 4)
    elif case == "rank":
        t = dict(zip(t, _pair(64, 64, 64)))
    elif case == "ranks":
        k = "base_lm.layers.1.self_attn.k_proj"
        t[f"{k}.lora_A"], t[f"{k}.lora_B"] = _pair(64, 32, 4)
    elif case == "half":
        del t[f"{Q}.lora_B"]
    elif case == "json_r":
        cfg = {"enable_lm": True, "r": 4}
    elif case == "json_field":
        cfg = {"enable_lm": True, "rank": 8}
    elif case == "json_type":
        cfg = {"enable_lm": "yes"}
    elif case == "json_bad":
        cfg = "{not json"
    elif case == "nan":
        t[f"{Q}.lora_B"] = torch.full((64, 8), float("nan"))
    elif case == "alpha_overflow":  # finite as a float64, not once lora_B is scaled by it in float32
        cfg = {"enable_lm": True, "alpha": 1e308}
    elif case == "b_overflow":  # one finite value past float32's largest once doubled
        t[f"{Q}.lora_B"] = torch.zeros(64, 8)
        t[f"{Q}.lora_B"][0, 0] = 3e38
    elif case == "empty":
        t = {}
    if case == "no_file":
        os.makedirs(d)
    else:
        _write(d, t, cfg)
    with pytest.raises(LoraError, match=message):
        load_adapter(d, linears, max_rank=32)


def test_an_adapter_past_the_tables_dtype_is_refused_naming_it(linears, tmp_path):
    """The tables hold lora_A and lora_B x alpha / r in the model's dtype: past float16's largest
    (65504) an adapter would turn to inf there, so a float16 server refuses it where bfloat16 takes it."""
    a, b = _pair(64, 64, 8)
    a[0, 0] = 7e4
    d = _write(str(tmp_path / "big_a"), {f"{Q}.lora_A": a, f"{Q}.lora_B": b})
    load_adapter(d, linears, max_rank=32, dtype=torch.bfloat16)
    with pytest.raises(LoraError, match=rf"{re.escape(Q)}\.lora_A has values past float16's range"):
        load_adapter(d, linears, max_rank=32, dtype=torch.float16)
    a, b = _pair(64, 64, 8)
    b[0, 0] = 4e4  # fits float16 alone, not times alpha / r = 16 / 8
    d = _write(str(tmp_path / "big_b"), {f"{Q}.lora_A": a, f"{Q}.lora_B": b})
    load_adapter(d, linears, max_rank=32, dtype=torch.bfloat16)
    with pytest.raises(LoraError, match=rf"{re.escape(Q)}\.lora_B times alpha / r \(16 / 8\) overflows float16"):
        load_adapter(d, linears, max_rank=32, dtype=torch.float16)
    adapters, errors = load_dir(str(tmp_path), linears, max_rank=32, dtype=torch.float16)
    assert not adapters and sorted(errors) == ["big_a", "big_b"]


def test_ckpt_format_and_compiled_key_names_load(linears, tmp_path):
    a, b = _pair(64, 64, 8, 0.5)
    dit_q = "feat_decoder.estimator.decoder.layers.0.self_attn.q_proj"
    # A model saved while torch.compile'd (the reference's optimize()) names the estimator's
    # parameters `feat_decoder.estimator._orig_mod.*`.
    d = _write(str(tmp_path / "ok"), {f"{Q}.lora_A": a, f"{Q}.lora_B": b,
                                      f"{dit_q.replace('estimator.', 'estimator._orig_mod.')}.lora_A": a[:, :32],
                                      f"{dit_q}.lora_B": b},
               {"enable_lm": True, "enable_dit": True, "alpha": 4}, "lora_weights.ckpt")
    ad = load_adapter(d, linears, max_rank=8)
    assert ad.name == "ok" and ad.rank == 8 and ad.scale == 0.5 and ad.modules == sorted([Q, dit_q])
    assert torch.equal(ad.weights[Q][0], a) and torch.equal(ad.weights[dit_q][0], a[:, :32])


def test_a_broken_adapter_is_reported_and_left_out(ckpt, lora_dir, tmp_path):
    d = str(tmp_path / "loras")
    shutil.copytree(os.path.join(lora_dir[0], "lm_dit"), os.path.join(d, "good"))
    a, b = _pair(64, 64, 8)
    _write(os.path.join(d, "broken"), {f"{Q}.lora_A": a, f"{Q}.lora_B": torch.zeros(3, 8)})
    os.makedirs(os.path.join(d, "bad name"))
    os.makedirs(os.path.join(d, ".hidden"))
    adapters, errors = load_dir(d, linears_of(ckpt), max_rank=32)
    assert list(adapters) == ["good"]
    assert sorted(errors) == ["bad name", "broken"]
    assert "has shape [3, 8], expected [64, 8]" in errors["broken"]
    assert "is not a valid LoRA adapter name" in errors["bad name"]
    v = VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=d)
    assert list(v.loras.slots) == ["good"]
    with pytest.raises(ValueError, match=r"LoRA adapter 'broken' was not loaded: .*has shape \[3, 8\]"):
        v.generate_latents("Hi.", lora="broken", max_len=2)
    assert v.generate_latents("Hi.", lora="good", seed=3, max_len=2).shape[0] == 2
    # The set a server had before a restart (lora_names): those, in its order; one gone is reported.
    shutil.copytree(os.path.join(d, "good"), os.path.join(d, "also"))
    v = VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=d, lora_names=["good", "gone"])
    assert list(v.loras.slots) == ["good"] and v.loras.errors == {"gone": "no longer in the LoRA directory"}


def test_an_adapter_left_out_for_want_of_slots_can_be_added_once_one_is_free(ckpt, lora_dir, tmp_path):
    """The tables cover every good adapter found at start-up, those past max_loras included: after a
    remove, the one left out is added (before, its targets were not covered and the error's advice,
    a restart with it in the directory, left it out again)."""
    from voxcpm_triton.lora_adapters import AdapterSet

    d = str(tmp_path / "loras")
    for n in ("lm_dit", "everything"):
        shutil.copytree(os.path.join(lora_dir[0], n), os.path.join(d, "a_lm_dit" if n == "lm_dit" else n))
    loras = AdapterSet.load(d, linears_of(ckpt), torch.float32, "cpu", max_loras=1, reserve="default")
    assert list(loras.slots) == ["a_lm_dit"]
    assert "all 1 LoRA slots are taken" in loras.errors["everything"]
    ad = loras.read("everything")  # covered: no LoraError
    assert not loras.tables.uncovered(ad.modules)
    # the tables' rank (max_rank not given) is the largest of all found, the one left out (r=8) too
    d2 = str(tmp_path / "loras2")
    for n, as_name in (("everything", "a_everything"), ("lm_dit", "z_lm_dit")):
        shutil.copytree(os.path.join(lora_dir[0], n), os.path.join(d2, as_name))
    loras = AdapterSet.load(d2, linears_of(ckpt), torch.float32, "cpu", max_loras=1)
    assert list(loras.slots) == ["a_everything"] and loras.tables.max_rank == 8
    assert loras.read("z_lm_dit").rank == 8


def linears_of(ckpt):
    v = VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32")
    return linear_shapes(v.model)


# ---------------------------------------------------------------- run-time management
def test_registry_defers_removal_and_replacement_until_requests_end():
    reg = LoraRegistry(2, {"a": 1})
    slot, gen = reg.acquire("a")
    assert slot == 1 and reg.refs == {1: 1}
    reg.unpublish("a")  # in use: gone for new requests, slot kept
    with pytest.raises(KeyError, match="unknown LoRA adapter 'a'"):
        reg.acquire("a")
    s2 = reg.take_free()
    assert s2 == 2
    with pytest.raises(LoraFull, match="all 2 LoRA slots are in use .* 1 wait for their requests to end"):
        reg.take_free()
    reg.release(1)  # the last request on the old slot ended: free again
    assert reg.take_free() == 1
    reg.give_back(1)
    g1 = reg.publish("b", s2)
    s3 = reg.take_free()
    assert reg.acquire("b")[0] == 2
    g2 = reg.publish("b", s3)  # replaced while in use: new requests get the new weights
    assert g2 != g1 and reg.acquire("b")[0] == s3 and reg.retired == {2}
    reg.release(2)
    assert reg.retired == set() and 2 in reg.free


def _engine_vox(ckpt, lora_dir, tmp_path, names, reserve="default", **kw):
    d = str(tmp_path / "served_loras")
    os.makedirs(d)
    for n in names:
        shutil.copytree(os.path.join(lora_dir, n), os.path.join(d, n))
    return d, VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=d, reserve_lora_targets=reserve,
                                      **kw)


def test_adapters_added_and_removed_while_serving(ckpt, lora_dir, vox, tmp_path):
    """Run-time management: an added adapter serves at once; one removed while a request runs on it
    is gone for new requests, the running one finishes on its weights, and its slot is reused only
    after; what does not fit the tables (targets, slots) is refused with the reason."""
    d, v = _engine_vox(ckpt, lora_dir[0], tmp_path, ["lm_dit"], max_loras=2, max_lora_rank=16)
    gen = dict(min_len=4, max_len=4, inference_timesteps=4)
    p = _prompt(v, 0)
    want = vox.generate_latents(None, prompt=p, seed=5, lora="lm_dit", **gen)
    eng = Engine(v, EngineConfig(num_blocks=128, block_size=4, max_num_seqs=4))
    try:
        assert eng.lora_names() == ["lm_dit"]
        with pytest.raises(ValueError, match=r"unknown LoRA adapter 'other' \(loaded: lm_dit\)"):
            eng.submit(EngineRequest("x", p, lora="other", **gen))
        with pytest.raises(LoraError, match="LoRA adapter directory not found: .*missing"):
            eng.add_lora("missing")
        with pytest.raises(LoraError, match="is not a valid LoRA adapter name"):
            eng.add_lora("../lm_dit")
        # Targets outside the tables (LM MLPs, projections: not the defaults, not at start-up).
        shutil.copytree(os.path.join(lora_dir[0], "lm_mlp_proj"), os.path.join(d, "mlp"))
        with pytest.raises(LoraError, match=r"adapter 'mlp' targets base_lm\.layers\.0\.mlp\.down_proj.*do not cover"):
            eng.add_lora("mlp")
        shutil.copytree(os.path.join(lora_dir[0], "lm_dit"), os.path.join(d, "copy"))
        assert eng.add_lora("copy") == ["copy", "lm_dit"]
        got, fin = eng.submit(EngineRequest("a", p, seed=5, lora="copy", **gen)).result(timeout=TIMEOUT)
        assert fin.error is None and maxdiff(got, want) <= TOL
        reads, read = [], eng.loras.adapters.read
        eng.loras.adapters.read = lambda n: reads.append(n) or read(n)
        with pytest.raises(LoraFull, match="all 2 LoRA slots are in use .*; replacing 'copy' needs a free slot "
                                           "too: remove an adapter first"):
            eng.add_lora("copy")  # a replacement is written beside the old weights
        assert reads == []  # refused before its files are read (instances retry a refused add often)
        del eng.loras.adapters.read

        # Removed while a request runs on it: that request finishes with its weights.
        slot = eng.loras.registry.published["lm_dit"][0]
        gate = threading.Event()
        long = dict(min_len=12, max_len=12, inference_timesteps=4)
        want_long = vox.generate_latents(None, prompt=p, seed=6, lora="lm_dit", **long)
        sink = _gated(gate)
        eng.submit(EngineRequest("b", p, seed=6, lora="lm_dit", **long), sink=sink)
        assert eng.remove_lora("lm_dit") == ["copy"]
        with pytest.raises(ValueError, match="unknown LoRA adapter 'lm_dit'"):
            eng.submit(EngineRequest("c", p, lora="lm_dit", **gen))
        assert slot in eng.loras.registry.retired
        # Its slot is not free yet: adding again needs the slot, so it waits for the request.
        with pytest.raises(LoraFull, match="1 wait for their requests to end"):
            eng.add_lora("lm_dit")
        gate.set()
        got, fin = _collect(sink)
        assert fin.error is None and maxdiff(got, want_long) <= TOL
        assert slot in eng.loras.registry.free and not eng.loras.registry.retired
        # An add that timed out before the engine thread took its write does not happen later: its
        # slot is free again (the add after it needs it). The lock (reentrant) holds the engine off.
        with eng.loras.lock:
            with pytest.raises(TimeoutError, match="the engine did not write it within 0 s"):
                eng.loras.add("lm_dit", timeout=0.05)
            assert not eng.loras.pending() and slot in eng.loras.registry.free
        assert eng.lora_names() == ["copy"]
        assert eng.add_lora("lm_dit") == ["copy", "lm_dit"]
        got, fin = eng.submit(EngineRequest("d", p, seed=5, lora="lm_dit", **gen)).result(timeout=TIMEOUT)
        assert fin.error is None and maxdiff(got, want) <= TOL
        assert eng.stats()["in_flight_ids"] == 0 and eng.loras.registry.refs == {}
    finally:
        eng.shutdown()


def test_tables_reserving_every_target_take_any_adapter_while_serving(ckpt, lora_dir, vox, tmp_path):
    """lora_targets=all: a server started with no adapter (or only default-target ones) adds, while
    serving, adapters on the LMs' MLPs, LocDiT's outer layers and the top-level projections, which
    then equal the offline API loaded with them from the start; the tables cover every layer an
    adapter may target and nothing else."""
    d, v = _engine_vox(ckpt, lora_dir[0], tmp_path, [], reserve="all", max_loras=2, max_lora_rank=16)
    covered = v.loras.tables.modules
    assert covered == {m for m in v.loras.linears if lora_format.adaptable(m)}
    assert any(".mlp." in m for m in covered) and "stop_head" in covered and "enc_to_lm_proj" in covered
    assert not any(m.startswith("feat_encoder.") for m in covered)  # LocEnc: no LoRAConfig reaches it
    gen = dict(min_len=4, max_len=4, inference_timesteps=4)
    p = _prompt(v, 1)
    eng = Engine(v, EngineConfig(num_blocks=128, block_size=4, max_num_seqs=4))
    try:
        assert eng.lora_names() == []
        for name in ("lm_mlp_proj", "everything"):
            shutil.copytree(os.path.join(lora_dir[0], name), os.path.join(d, name))
            eng.add_lora(name)
        assert eng.lora_names() == ["everything", "lm_mlp_proj"]
        futures = {n: eng.submit(EngineRequest(n, p, seed=9, lora=n, **gen)) for n in ("lm_mlp_proj", "everything")}
        for n, f in futures.items():
            got, fin = f.result(timeout=TIMEOUT)
            want = vox.generate_latents(None, prompt=p, seed=9, lora=n, **gen)
            assert fin.error is None and maxdiff(got, want) <= TOL, n
        assert eng.stats()["in_flight_ids"] == 0
    finally:
        eng.shutdown()
    with pytest.raises(ValueError, match=r"reserve must be None or one of default, all, got 'some'"):
        _engine_vox(ckpt, lora_dir[0], tmp_path / "x", [], reserve="some")


def _gated(gate):
    """A sink that holds the engine thread at the request's first chunk until `gate` is set."""
    import queue

    q, entered = queue.Queue(), threading.Event()

    def sink(ev):
        entered.set()
        gate.wait(TIMEOUT)
        q.put(ev)

    sink.queue, sink.entered = q, entered
    return sink


def _collect(sink):
    q = sink.queue
    chunks = []
    while True:
        ev = q.get(timeout=TIMEOUT)
        if isinstance(ev, Finished):
            return torch.cat(chunks), ev
        chunks.append(ev.patches)


def test_an_engine_without_adapters_refuses_lora(vox, ckpt):
    plain = VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32")
    eng = Engine(plain, EngineConfig(num_blocks=16, block_size=4))
    try:
        with pytest.raises(ValueError, match="requested but this server loads no adapters"):
            eng.submit(EngineRequest("x", _prompt(plain, 0), max_len=4, lora="lm_dit"))
        with pytest.raises(ValueError, match="loads no LoRA adapters"):
            eng.add_lora("lm_dit")
        assert eng.lora_names() == [] and eng.runner.lora is None
    finally:
        eng.shutdown()


@torch.inference_mode()
def test_make_tiny_lora_writes_what_the_reference_loads_and_what_we_serve_changes_the_voice(ckpt, tmp_path):
    """scripts/make_tiny_lora.py (the README's way to try adapters on the tiny checkpoint) writes the
    official layout: the reference's own loader takes every key and skips none, and the result
    through our model equals the reference's with the same adapter."""
    import subprocess
    import sys

    from tests.lora_helpers import reference_model

    out = tmp_path / "loras" / "narrator"
    p = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "make_tiny_lora.py"),
                        "--checkpoint", ckpt, "--out", str(out), "--seed", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "wrote" in p.stdout, p.stderr
    config = json.loads((out / "lora_config.json").read_text())
    ref = reference_model(ckpt, config)
    want_keys = sorted(k for k, _ in ref.named_parameters() if "lora_" in k)
    loaded, skipped = ref.load_lora_weights(str(out), device="cpu")
    assert skipped == [] and sorted(loaded) == want_keys and want_keys
    vox = VoxCPM2.from_pretrained(ckpt, device="cpu", dtype="float32", lora_dir=str(out.parent))
    assert vox.loras.errors == {} and sorted(vox.loras.slots) == ["narrator"]
    text, kw, cache = _mode_inputs("zero_shot", vox, tmp_path)
    steps = 8
    noise = noise_for_steps(5, steps, (vox.feat_dim, vox.patch_size))
    gen = dict(min_len=steps, max_len=steps, cfg_value=2.0, inference_timesteps=4)
    want, _ = _run_reference(ref, text, cache, noise, **gen)
    got = vox.generate_latents(text, noise=noise, lora="narrator", **gen, **kw)
    assert maxdiff(got, want) <= TOL
    assert maxdiff(got, vox.generate_latents(text, noise=noise, **gen, **kw)) > 100 * TOL
    bad = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "make_tiny_lora.py"),
                          "--checkpoint", ckpt, "--out", str(tmp_path / ".hidden")], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "is not a valid LoRA adapter name" in bad.stderr, bad.stderr
    for alpha in ("0", "nan", "inf"):  # what the loader would refuse is not written
        bad = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "make_tiny_lora.py"),
                              "--checkpoint", ckpt, "--out", str(tmp_path / "odd"), "--alpha", alpha],
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and "alpha must be a positive number" in bad.stderr, bad.stderr
    assert not (tmp_path / "odd").exists()
