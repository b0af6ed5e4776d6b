"""The table of model parameters (serving/parameters.py) against what it describes: the
config.pbtxt files, the README's Configuration table, and the rules across models."""

import json
import logging
import re

import pytest

from tests.server import REPO, edited_repository
from voxcpm_triton.serving import parameters
from voxcpm_triton.serving.parameters import PARAMETERS, TABLE, parse_values, read, read_pbtxt


def _args(repo, model):
    """Triton's `args` for `model` of repository `repo`, as the python backend hands them over."""
    raw, idle = read_pbtxt(str(repo / model / "config.pbtxt"))
    cfg = {"parameters": {k: {"string_value": v} for k, v in raw.items()}}
    if idle is not None:
        cfg["sequence_batching"] = {"max_sequence_idle_microseconds": str(idle)}
    return {"model_config": json.dumps(cfg), "model_name": model, "model_repository": str(repo / model)}


def test_every_config_pbtxt_parameter_is_in_the_table_with_its_default():
    for model, params in TABLE.items():
        raw, _ = read_pbtxt(str(REPO / "model_repository" / model / "config.pbtxt"))
        assert set(raw) == set(params), model
        for name, p in params.items():
            assert raw[name] == p.default, f"{model}.{name}: config.pbtxt {raw[name]!r}, table {p.default!r}"
            p.parse(p.default)  # every default is allowed
    assert len(PARAMETERS) == len({(p.model, p.name) for p in PARAMETERS})


def test_the_dtype_choices_are_the_models():
    from voxcpm_triton.model.config import DTYPES

    assert set(parameters.DTYPES) - {"auto"} == set(DTYPES)


def test_values_are_typed_and_bad_ones_name_the_parameter_and_what_is_allowed():
    v = parse_values("decoder", {"chunk_schedule": "1, 4,16", "cuda_graphs": " Off ", "kv_cache_mb": "512.5"})
    assert v["chunk_schedule"] == (1, 4, 16) and v["cuda_graphs"] is False and v["kv_cache_mb"] == 512.5
    assert v["max_num_seqs"] == 128 and v["num_blocks"] is None and v["attention"] == "auto"
    assert parse_values("vae_decoder", {"compile": "yes", "max_streams": ""})["max_streams"] == 256
    v = parse_values("decoder", {"dtype": "BF16", "attention": " Triton", "precision": "FP8"})
    assert (v["dtype"], v["attention"], v["precision"]) == ("bf16", "triton", "fp8")  # any case, as bools
    bad = {
        ("decoder", "attention", "tritno"): "must be one of auto, triton, torch, got 'tritno'",
        ("decoder", "dtype", "fp8"): "must be one of auto, float32",
        ("decoder", "compile", "ture"): "must be true or false, got 'ture'",
        ("decoder", "chunk_schedule", "1,,4"): "must be positive integers separated by commas",
        ("decoder", "chunk_schedule", "1,0"): "must be positive integers separated by commas",
        ("decoder", "kv_cache_mb", "inf"): "must be a positive number",
        ("vae_decoder", "max_streams", "2.5"): "must be a positive integer, got '2.5'",
        ("vae_decoder", "max_streams", "-3"): "must be a positive integer",
        ("tts_stream", "max_concurrent_streams", "many"): "must be a positive integer",
    }
    for (model, name, value), message in bad.items():
        with pytest.raises(ValueError, match=re.escape(f"parameter '{name}' of model '{model}' {message}")):
            parse_values(model, {name: value})


def test_unknown_keys_are_an_error_naming_them():
    with pytest.raises(ValueError, match="model 'vae_decoder' has no parameter\\(s\\) cuda_graph, max_batch_size; "
                                         "it takes checkpoint, compile"):
        parse_values("vae_decoder", {"cuda_graph": "false", "max_batch_size": "4"})


def test_a_renamed_parameter_is_refused_with_its_new_name():
    with pytest.raises(ValueError, match="parameter 'max_batch_size' of model 'decoder' is now called max_num_seqs "
                                         "\\(Triton's own max_batch_size"):
        parse_values("decoder", {"max_batch_size": "64"})


def test_only_the_documented_environment_variables_override(monkeypatch, tmp_path):
    monkeypatch.setenv("VOXCPM_CUDA_GRAPHS", "0")
    monkeypatch.setenv("VOXCPM_MAX_STREAMS", "1")
    v = parse_values("vae_decoder", {"cuda_graphs": "true"})
    assert v["cuda_graphs"] is True and v["max_streams"] == 256
    monkeypatch.setenv("VOXCPM_CHECKPOINT", str(tmp_path))
    monkeypatch.setenv("VOXCPM_DEVICE", "cpu")
    monkeypatch.setenv("VOXCPM_DTYPE", "bf16")
    v = parse_values("decoder", {"checkpoint": "/elsewhere", "device": "cuda", "dtype": ""})
    assert (v["checkpoint"], v["device"], v["dtype"]) == (str(tmp_path), "cpu", "bf16")
    assert {p.env for p in PARAMETERS} == {None, "VOXCPM_CHECKPOINT", "VOXCPM_DEVICE", "VOXCPM_DTYPE",
                                           "VOXCPM_VOICES_DIR", "VOXCPM_LORA_DIR"}
    monkeypatch.setenv("VOXCPM_DTYPE", "fp8")  # an override is checked like the value it replaces
    with pytest.raises(ValueError, match="parameter 'dtype' of model 'decoder' must be one of"):
        parse_values("decoder", {})
    # blank is unset: config.pbtxt's value holds (it took the table's default: LoRA off, dtype automatic)
    monkeypatch.setenv("VOXCPM_DTYPE", " ")
    monkeypatch.setenv("VOXCPM_LORA_DIR", "  ")
    v = parse_values("decoder", {"lora_dir": str(tmp_path), "dtype": "bf16"})
    assert (v["lora_dir"], v["dtype"]) == (str(tmp_path), "bf16")


def test_the_project_repository_passes_its_own_checks(tmp_path, caplog):
    repo = edited_repository(tmp_path / "repo")
    with caplog.at_level(logging.WARNING, "voxcpm_triton.parameters"):
        for model in TABLE:
            assert read(_args(repo, model), model) == parse_values(model, {})
    assert not caplog.records


def test_a_chunk_longer_than_vae_decoder_takes_stops_both_models(tmp_path):
    """Only where vae_decoder decodes the decoder's chunks (decode_audio false)."""
    repo = edited_repository(tmp_path / "repo", parameters={
        "decoder": {"chunk_schedule": "1,4,300", "decode_audio": "false"}, "vae_decoder": {"graph_patches": "1,4,300"}})
    for model in ("decoder", "vae_decoder"):
        with pytest.raises(ValueError, match="decoder's parameter 'chunk_schedule' sends chunks of 300 patches, more "
                                             "than vae_decoder's parameter 'max_chunk_patches' \\(256\\)"):
            read(_args(repo, model), model)
    read(_args(repo, "tts"), "tts")  # models the rule does not read are not stopped by it
    # With decode_audio (the default) the decoder decodes its own chunks: vae_decoder's limit does not apply.
    repo = edited_repository(tmp_path / "in_decoder", parameters={"decoder": {"chunk_schedule": "1,4,300"},
                                                                   "vae_decoder": {"graph_patches": "1,4,300"}})
    for model in ("decoder", "vae_decoder"):
        read(_args(repo, model), model)


def test_a_chunk_length_without_a_vae_graph_is_a_warning(tmp_path, caplog):
    """Where vae_decoder decodes the decoder's chunks (decode_audio false), each chunk_schedule length
    wants a graph there; with decode_audio the decoder's own VAE has a graph for each."""
    without = {"decode_audio": "false"}
    repo = edited_repository(tmp_path / "repo",
                             parameters={"vae_decoder": {"graph_patches": "1,16"}, "decoder": without})
    with caplog.at_level(logging.WARNING, "voxcpm_triton.parameters"):
        read(_args(repo, "decoder"), "decoder")
    assert "chunk lengths [4]" in caplog.text and "'graph_patches'" in caplog.text
    for name, params in (("eager", {"vae_decoder": {"graph_patches": "1,16", "cuda_graphs": "false"}, "decoder": without}),
                         ("in_decoder", {"vae_decoder": {"graph_patches": "1,16"}})):
        caplog.clear()
        repo = edited_repository(tmp_path / name, parameters=params)
        with caplog.at_level(logging.WARNING, "voxcpm_triton.parameters"):
            read(_args(repo, "decoder"), "decoder")
        assert not caplog.records, f"{name}: nothing is missing"


def test_the_stream_idle_timeout_fits_the_sequence_batchers(tmp_path):
    repo = edited_repository(tmp_path / "repo", parameters={"vae_decoder": {"stream_idle_timeout_s": "300"}})
    with pytest.raises(ValueError, match="'stream_idle_timeout_s' of model 'vae_decoder' \\(300\\) must not exceed "
                                         "the sequence batcher's max_sequence_idle_microseconds \\(120 s\\)"):
        read(_args(repo, "vae_decoder"), "vae_decoder")
    cfg = repo / "vae_decoder" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_sequence_idle_microseconds: 120000000",
                                           "max_sequence_idle_microseconds: 300000000"))
    assert read(_args(repo, "vae_decoder"), "vae_decoder")["stream_idle_timeout_s"] == 300.0


def _readme_rows():
    """(models, knobs, default cell) of each README Configuration row about a config.pbtxt."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Configuration"):]
    section = section[:section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and "config.pbtxt" in cells[0]:
            models = re.findall(r"`(\w+)/config\.pbtxt`", cells[0])
            # A knob with a dot is a field of config.pbtxt (instance_group.count), not a parameter.
            knobs = [k for k in re.findall(r"`([\w.]+)`", cells[1]) if "." not in k]
            rows.append((models, knobs, cells[2]))
    return rows


def test_the_readme_configuration_table_matches_the_table():
    rows = _readme_rows()
    for p in PARAMETERS:
        cells = [d for models, knobs, d in rows if p.model in models and p.name in knobs]
        assert cells, f"README's Configuration table has no row for {p.model}/config.pbtxt {p.name}"
        want = "empty" if p.default == "" else p.default
        assert any(re.search(rf"(?<![\w.,]){re.escape(want)}(?![\w,])", d) for d in cells), \
            f"README's row for {p.model}.{p.name} does not give its default {want!r}"
    for models, knobs, _ in rows:
        for model in models:
            for knob in knobs:
                assert knob in TABLE.get(model, {}), f"README names {model}/config.pbtxt {knob}, which is no parameter"


def test_the_voices_dir_is_one_for_the_models_that_share_it(tmp_path, monkeypatch):
    """Unless VOXCPM_VOICES_DIR overrides all three; a blank one is unset, as everywhere."""
    repo = edited_repository(tmp_path / "repo", parameters={"voices": {"voices_dir": "/srv/voices"}})
    for blank in (None, " "):
        if blank is None:
            monkeypatch.delenv("VOXCPM_VOICES_DIR", raising=False)
        else:
            monkeypatch.setenv("VOXCPM_VOICES_DIR", blank)
        for model in ("tts", "voices"):
            with pytest.raises(ValueError, match="'voices_dir'.*must name one directory"):
                read(_args(repo, model), model)
    read(_args(repo, "decoder"), "decoder")
    monkeypatch.setenv("VOXCPM_VOICES_DIR", str(tmp_path))
    assert read(_args(repo, "voices"), "voices")["voices_dir"] == str(tmp_path)


def test_serve_sh_pre_flight_reads_the_environment_as_the_models_do(checkpoint_dirs, tmp_path):
    """Blank is unset and a value is stripped (Param.parse): a checkpoint path with spaces around it,
    which every model serves, was refused; a blank VOXCPM_DTYPE is no dtype to check."""
    from voxcpm_triton.serving.preflight import problems

    ckpt = checkpoint_dirs["real_shaped"]
    assert problems({"VOXCPM_CHECKPOINT": f" {ckpt} ", "VOXCPM_DTYPE": " ", "VOXCPM_LORA_DIR": " ",
                     "VOXCPM_DEVICE": " cpu "}) == []
    assert problems({"VOXCPM_CHECKPOINT": str(tmp_path), "VOXCPM_DTYPE": "FP64"}) == [
        f"VOXCPM_CHECKPOINT={tmp_path} cannot be served: {tmp_path}: no config file (expected one of config.json)",
        "VOXCPM_DTYPE=FP64 is not a dtype: must be one of auto, float32, fp32, bfloat16, bf16, float16, fp16"]
    assert problems({"VOXCPM_DTYPE": " FP32 "}) == []  # a choice is read in any case, as a bool is


def test_serve_sh_pre_flight_reads_the_repository_as_the_models_do(checkpoint_dirs, tmp_path, monkeypatch):
    """A config.pbtxt value its model refuses failed that model's load at every start, five in a row: each
    is said once, naming its file (a value given to several models, once for all of them); a rule between
    two models once; a value that a set environment variable overrides is not the file's to answer for."""
    from voxcpm_triton.serving.preflight import problems

    for var in ("VOXCPM_CHECKPOINT", "VOXCPM_DTYPE", "VOXCPM_DEVICE", "VOXCPM_LORA_DIR", "VOXCPM_VOICES_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert problems({}, str(REPO / "model_repository")) == []
    none = tmp_path / "none"
    repo = edited_repository(tmp_path / "repo", parameters={
        "decoder": {"checkpoint": str(none), "dtype": "fp64", "lora_dir": str(none), "device": "meta",
                    "chunk_schedule": "1,x"},
        "vae_decoder": {"checkpoint": str(none), "stream_idle_timeout_s": "99999"},
        "tokenizer": {"bogus": "1"}})
    cfg = {m: str(repo / m / "config.pbtxt") for m in ("decoder", "vae_decoder", "tokenizer")}
    assert problems({}, str(repo)) == [
        f"{cfg['tokenizer']}: model 'tokenizer' has no parameter(s) bogus; it takes checkpoint",
        f"{cfg['decoder']}: parameter 'dtype' of model 'decoder' must be one of auto, float32, fp32, bfloat16, "
        "bf16, float16, fp16, got 'fp64'",
        f"{cfg['decoder']}: parameter 'chunk_schedule' of model 'decoder' must be positive integers separated by "
        "commas, got '1,x'",
        f"{cfg['vae_decoder']}: parameter 'checkpoint' ({none}) cannot be used: checkpoint directory not found: "
        f"{none}",
        "parameter 'stream_idle_timeout_s' of model 'vae_decoder' (99999) must not exceed the sequence batcher's "
        "max_sequence_idle_microseconds (120 s)"]
    repo = edited_repository(tmp_path / "repo2", parameters={
        m: {"checkpoint": str(none)} for m in ("decoder", "vae_decoder")} | {
        "decoder": {"checkpoint": str(none), "dtype": "fp64", "lora_dir": str(none), "device": "meta"}})
    cfg = {m: str(repo / m / "config.pbtxt") for m in ("decoder", "vae_decoder")}
    assert problems({}, str(repo)) == [  # a model with a value it refuses: its other values wait
        f"{cfg['decoder']}: parameter 'dtype' of model 'decoder' must be one of auto, float32, fp32, bfloat16, "
        "bf16, float16, fp16, got 'fp64'",
        f"{cfg['vae_decoder']}: parameter 'checkpoint' ({none}) cannot be used: checkpoint directory not found: "
        f"{none}"]
    repo.joinpath("decoder", "config.pbtxt").write_text(
        repo.joinpath("decoder", "config.pbtxt").read_text().replace('"fp64"', '"bf16"'))
    assert problems({}, str(repo)) == [
        f"{cfg['decoder']}, {cfg['vae_decoder']}: parameter 'checkpoint' ({none}) cannot be used: checkpoint "
        f"directory not found: {none}",
        f"{cfg['decoder']}: parameter 'lora_dir' ({none}) cannot be used: not a directory",
        f"{cfg['decoder']}: parameter 'device' (meta) cannot be used: device 'meta': must be cpu, cuda or "
        "cuda:<index> (or auto)"]
    # the environment wins over every config.pbtxt: the files' values are never used
    env = {"VOXCPM_CHECKPOINT": str(checkpoint_dirs["real_shaped"]), "VOXCPM_LORA_DIR": str(tmp_path),
           "VOXCPM_DEVICE": "cpu"}
    assert problems(env, str(repo)) == []


SPELLINGS = [  # the same parameters, as protobuf's text format allows writing them
    'parameters { key: "a" value { string_value: "1" } }',
    'parameters: { key: "a", value: { string_value: "1" } },',  # Triton's docs' style
    "parameters < key: 'a' value < string_value: '1' > >;",
    'parameters { value { string_value: "1" } key: "a" }',  # fields in the other order
    'parameters [ { key: "a" value { string_value: "1" } } ]',  # a list
    'parameters { key: "a" value { string_value: "1" "" } }  # a comment: key: "b"',  # adjacent strings
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_config_pbtxt_is_read_as_protobufs_text_format_reads_it(tmp_path, spelling):
    """Siblings' parameters and serve.sh's pre-flight read config.pbtxt themselves: a spelling the old
    pattern did not know (commas, single quotes, < >, another field order) was read as absent, and the
    default then broke a rule between models that the file kept (the pre-flight refused to start)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    text = (f'name: "m"\n{spelling}\nparameters {{ key: "h#sh" value {{ string_value: "x # y \\" z" }} }}\n'
            "sequence_batching { max_sequence_idle_microseconds: 60000000 }\n")
    path = tmp_path / "config.pbtxt"
    path.write_text(text)
    want = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert read_pbtxt(str(path)) == ({k: v.string_value for k, v in want.parameters.items()}, 60000000)
    assert read_pbtxt(str(path))[0] == {"a": "1", "h#sh": 'x # y " z'}
    path.write_text('parameters { key: "a" value { string_value: "1" }')
    with pytest.raises(ValueError, match="not protobuf text format"):
        read_pbtxt(str(path))


def test_the_pre_flight_takes_a_repository_written_in_another_text_format_style(tmp_path, monkeypatch):
    from voxcpm_triton.serving.preflight import problems

    for var in ("VOXCPM_CHECKPOINT", "VOXCPM_DTYPE", "VOXCPM_DEVICE", "VOXCPM_LORA_DIR", "VOXCPM_VOICES_DIR"):
        monkeypatch.delenv(var, raising=False)
    repo = edited_repository(tmp_path / "repo")
    cfg = repo / "vae_decoder" / "config.pbtxt"
    text = cfg.read_text().replace("max_sequence_idle_microseconds: 120000000", "max_sequence_idle_microseconds: 60000000")
    cfg.write_text(text + '\nparameters: { key: "stream_idle_timeout_s", value: { string_value: "60" } }\n')
    assert problems({}, str(repo)) == []
    cfg.write_text(text + '\nparameters: { key: "stream_idle_timeout_s", value: { string_value: "61" } }\n')
    assert problems({}, str(repo)) == [
        "parameter 'stream_idle_timeout_s' of model 'vae_decoder' (61) must not exceed the sequence batcher's "
        "max_sequence_idle_microseconds (60 s)"]
