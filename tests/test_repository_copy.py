"""scripts/repository_copy.py (run_served_gpu.sh's SET): a model repository copied with parameters set,
checked as the models check them before any server starts, and `parameters.with_parameters`, which
writes them (tests/server.py's edited_repository writes through it too)."""

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from voxcpm_triton.serving.parameters import read_pbtxt, with_parameters

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "repository_copy.py"


def run(*args, env=None):
    env = {k: v for k, v in os.environ.items() if k != "VOXCPM_PYTHON_BACKEND"} | (env or {})
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=60, env=env)


def test_it_sets_given_and_new_parameters_and_copies_the_rest_unchanged(tmp_path):
    dst = tmp_path / "repo"
    proc = run(REPO / "model_repository", dst, "decoder.timestep_buckets=10,100", "decoder.playback_margin_ms=150",
               "vae_decoder.stream_idle_timeout_s=120")
    assert proc.returncode == 0, proc.stderr
    assert "decoder.playback_margin_ms = '150'" in proc.stdout
    decoder, _ = read_pbtxt(dst / "decoder" / "config.pbtxt")
    original, _ = read_pbtxt(REPO / "model_repository" / "decoder" / "config.pbtxt")
    assert decoder == original | {"timestep_buckets": "10,100", "playback_margin_ms": "150"}
    text = (dst / "decoder" / "config.pbtxt").read_text()
    assert text.count('key: "playback_margin_ms"') == 1  # replaced where it was, not appended
    vae, _ = read_pbtxt(dst / "vae_decoder" / "config.pbtxt")
    assert vae["stream_idle_timeout_s"] == "120"
    assert _files(dst) == _files(REPO / "model_repository")
    changed = {"decoder/config.pbtxt", "vae_decoder/config.pbtxt"}
    for name in _files(dst) - changed:
        assert filecmp.cmp(REPO / "model_repository" / name, dst / name, shallow=False), name


def _files(root: Path) -> set:
    """Every file under root (its path from root), __pycache__ left out."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("spec, message", [
    ("decoder=1", "is not MODEL.KEY=VALUE"),
    ("decodr.playback_margin_ms=1", "has no model 'decodr'"),
    ("decoder.playback_margn_ms=1", "has no parameter(s) playback_margn_ms"),
    ("decoder.playback_margin_ms=soon", "'playback_margin_ms' of model 'decoder' must be milliseconds"),
    ("decoder.decode_audio=false decoder.chunk_schedule=1,4,300", "more than vae_decoder's parameter 'max_chunk_patches'"),
])
def test_a_bad_setting_is_named_and_leaves_no_copy(tmp_path, spec, message):
    dst = tmp_path / "repo"
    proc = run(REPO / "model_repository", dst, "decoder.timestep_buckets=10,100", *spec.split())
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not dst.exists()


def test_a_copy_that_fails_part_way_is_named_and_removed(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "model_repository", src, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "decoder" / "dangling").symlink_to(tmp_path / "nowhere")
    proc = run(src, tmp_path / "repo", "decoder.timestep_buckets=10,100")
    assert proc.returncode == 2 and "[repository_copy] Error:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "repo").exists()


def test_it_refuses_an_existing_destination_and_a_missing_source(tmp_path):
    (tmp_path / "taken").mkdir()
    proc = run(REPO / "model_repository", tmp_path / "taken", "decoder.timestep_buckets=10,100")
    assert proc.returncode == 2 and "exists already" in proc.stderr, proc.stderr
    proc = run(tmp_path / "nowhere", tmp_path / "repo")
    assert proc.returncode == 2 and "no model repository" in proc.stderr and not (tmp_path / "repo").exists()
    # a copy inside the repository would be taken for one of its models (the server then fails to
    # load)
    shutil.copytree(REPO / "model_repository", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for dst in (tmp_path / "src" / "fast", tmp_path / "src" / "a" / "b"):
        proc = run(tmp_path / "src", dst)
        assert proc.returncode == 2 and "is inside" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "src" / "fast").exists()


def test_it_checks_against_the_parameter_table_of_voxcpm_python_backend(tmp_path):
    """Another commit's code (an A/B) has its own parameters: the copy is checked against its table."""
    backend = tmp_path / "python_backend"
    serving = backend / "voxcpm_triton" / "serving"
    serving.mkdir(parents=True)
    source = (REPO / "python_backend" / "voxcpm_triton" / "serving" / "parameters.py").read_text()
    anchor = '    Param("decoder", "playback_margin_ms",'
    assert anchor in source
    extra = '    Param("decoder", "audio_senders", "int", "1", "threads sending audio (an older experiment)"),\n'
    (serving / "parameters.py").write_text(source.replace(anchor, extra + anchor, 1))
    spec = "decoder.audio_senders=4"
    proc = run(REPO / "model_repository", tmp_path / "theirs", spec, env={"VOXCPM_PYTHON_BACKEND": str(backend)})
    assert proc.returncode == 0, proc.stderr
    assert read_pbtxt(tmp_path / "theirs" / "decoder" / "config.pbtxt")[0]["audio_senders"] == "4"
    proc = run(REPO / "model_repository", tmp_path / "ours", spec)
    assert proc.returncode == 2 and "audio_senders" in proc.stderr, proc.stderr
    proc = run(REPO / "model_repository", tmp_path / "none", spec, env={"VOXCPM_PYTHON_BACKEND": str(tmp_path)})
    assert proc.returncode == 2 and "has no voxcpm_triton/serving/parameters.py" in proc.stderr, proc.stderr
    (serving / "parameters.py").write_text("raise RuntimeError('an older file that breaks')\n")
    proc = run(REPO / "model_repository", tmp_path / "broken", spec, env={"VOXCPM_PYTHON_BACKEND": str(backend)})
    assert proc.returncode == 2 and "does not load: RuntimeError: an older file that breaks" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "broken").exists()


def test_with_parameters_replaces_every_entry_of_its_key_and_leaves_comments():
    text = ('# parameters { key: "a" value { string_value: "in a comment" } }\n'
            'parameters { key: "a" value { string_value: "1" } }  # a trailing "comment"\n'
            'parameters { key : "b" value: { string_value : "x" } }\n'
            'parameters { key: "aXb" value { string_value: "kept" } }\n'
            'parameters { key: "a" value { string_value: "again" } }\n')
    out = with_parameters(text, {"a": "2", "b": "10,100", "c": "/srv/new dir"})
    assert out.splitlines() == [
        text.splitlines()[0],
        'parameters { key: "a" value { string_value: "2" } }  # a trailing "comment"',
        'parameters { key : "b" value: { string_value : "10,100" } }',
        'parameters { key: "aXb" value { string_value: "kept" } }',
        'parameters { key: "a" value { string_value: "2" } }',
        'parameters { key: "c" value { string_value: "/srv/new dir" } }']


@pytest.mark.parametrize("values, message", [
    ({"a.b": "1"}, "letters, digits and _ only"),
    ({'a"': "1"}, "letters, digits and _ only"),
    ({"a": "12#8"}, "cannot hold #"),
    ({"a": 'say "hi"'}, "cannot hold #, quotes"),
    ({"a": "C:\\dir"}, "backslashes"),
    ({"a": "1\n2"}, "newlines"),
    ({"split": "1"}, "not on one line"),
])
def test_with_parameters_refuses_what_would_not_read_back_as_written(values, message):
    text = ('parameters { key: "a" value { string_value: "1" } }\n'
            'parameters {\n  key: "split"\n  value { string_value: "0" }\n}\n')
    with pytest.raises(ValueError, match=message):
        with_parameters(text, values)


def test_the_script_needs_no_torch(tmp_path):
    """It runs where the server's Python has no torch (the device machine's tools, a bare host)."""
    probe = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", probe, str(SCRIPT), str(REPO / "model_repository"),
                           str(tmp_path / "repo"), "decoder.timestep_buckets=10,100"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(tmp_path / "repo")
