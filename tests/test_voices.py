"""Stored voices through a real tritonserver (tiny checkpoint, CPU): the `voices` model, VOICE /
VOICE_MODE on `tts`, the client's `voices` subcommand, persistence across a restart."""

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.conftest import require_module, sine_wave

require_module("tritonclient", "tritonclient[all] in requirements.txt")
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.server import REPO, triton_server_factory  # noqa: E402,F401
from tests.test_server import stream_infer, tts_http, _inputs  # noqa: E402
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

sys.path.insert(0, str(REPO / "client"))
import voxcpm_client  # noqa: E402

TOL = 1e-4
TEXT = "The stored voice says something new."
TRANSCRIPT = "What the stored audio says."
GEN = dict(SEED=11, MIN_LENGTH=3, MAX_LENGTH=3)
NAME_ERROR = "is not a valid voice name"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("voices_ckpt")), TINY_CONFIG, seed=3, progress=None)


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("voices_home") / "voices")  # made by the server, 0700


@pytest.fixture(scope="module")
def env(ckpt, voices_dir):
    return {"VOXCPM_CHECKPOINT": ckpt, "VOXCPM_VOICES_DIR": voices_dir}


@pytest.fixture(scope="module")
def server(triton_server_factory, env):  # noqa: F811
    return triton_server_factory("model_repository", env=env)


def voices(server, action, name=None, audio=None, rate=None, text=None, lora=None):
    """The `voices` model over HTTP, as raw tensors (so malformed requests can be sent too)."""
    arrays = {} if action is None else {"ACTION": np.array([action.encode()], dtype=object)}
    if name is not None:
        arrays["NAME"] = np.array([name.encode()], dtype=object)
    if audio is not None:
        arrays["AUDIO"] = np.asarray(audio, np.float32)
    if rate is not None:
        arrays["SAMPLE_RATE"] = np.array([rate], np.int32)
    if text is not None:
        arrays["TEXT"] = np.array([text.encode()], dtype=object)
    if lora is not None:
        arrays["LORA"] = np.array([lora.encode()], dtype=object)
    inputs = []
    for k, a in arrays.items():
        t = httpclient.InferInput(k, list(a.shape), {np.float32: "FP32", np.int32: "INT32"}.get(a.dtype.type, "BYTES"))
        t.set_data_from_numpy(a)
        inputs.append(t)
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    try:
        out = c.infer("voices", inputs).as_numpy("NAMES")
    finally:
        c.close()
    return [n.decode() for n in out.reshape(-1)]


def _b(s):
    return ("BYTES", np.array([s.encode()], dtype=object))


def ref_audio(seed=0):
    return sine_wave(0.7, 16000, freq=180 + 40 * seed, seed=seed)


def test_add_list_remove_replace(server, voices_dir):
    assert voices(server, "list") == []
    assert voices(server, "add", "alice", ref_audio(0), 16000) == ["alice"]
    assert voices(server, "add", "bob.v2", ref_audio(1), 16000, TRANSCRIPT) == ["alice", "bob.v2"]
    assert voices(server, "list") == ["alice", "bob.v2"]
    # the stored form: a link to one written version, private directory
    assert oct(os.stat(voices_dir).st_mode & 0o777) == "0o700"
    assert os.path.islink(os.path.join(voices_dir, "alice"))
    assert sorted(os.listdir(os.path.join(voices_dir, "bob.v2"))) == ["latents.safetensors", "voice.json"]
    before = os.path.realpath(os.path.join(voices_dir, "alice"))
    assert voices(server, "add", "alice", ref_audio(2), 16000, TRANSCRIPT) == ["alice", "bob.v2"]  # replaced
    assert not os.path.exists(before), "the replaced version is removed"
    assert len(os.listdir(os.path.join(voices_dir, ".store"))) == 2, "no version or temp directory left over"
    assert voices(server, "remove", "bob.v2") == ["alice"]
    with pytest.raises(InferenceServerException, match="unknown voice 'bob.v2'"):
        voices(server, "remove", "bob.v2")
    assert voices(server, "remove", "alice") == []


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "x" * 65, "a b", "/etc"])
def test_path_like_empty_and_long_names_are_refused(server, voices_dir, name):
    with pytest.raises(InferenceServerException, match=NAME_ERROR):
        voices(server, "add", name, ref_audio(), 16000)
    with pytest.raises(InferenceServerException, match=NAME_ERROR):
        tts_http(server, TEXT, VOICE=_b(name), **GEN)
    assert not os.path.exists(os.path.join(os.path.dirname(voices_dir), "x"))
    assert voices(server, "list") == []


def test_a_huge_name_comes_back_cut_short(server):
    """A megabyte-long VOICE is named in its error by its first characters and length: the whole of it
    would be over gRPC's 16 KiB limit on an error message (RESOURCE_EXHAUSTED instead of the error)."""
    from tests.test_server import grpcclient
    huge = "x" * 100_000
    want = rf"VOICE 'x{{80}}'\.\.\. \(100000 characters\) {NAME_ERROR}"
    with pytest.raises(InferenceServerException, match=want) as info:
        stream_infer(server, "tts_stream", _inputs(grpcclient, TEXT, VOICE=_b(huge), **GEN))
    assert len(info.value.message()) < 400
    with pytest.raises(InferenceServerException, match=r"NAME 'x{80}'\.\.\. \(4000 characters\)"):
        voices(server, "add", huge[:4000], ref_audio(), 16000)
    with pytest.raises(InferenceServerException, match=r"got 'y{80}'\.\.\. \(4000 characters\)$"):
        voices(server, "y" * 4000)
    voices(server, "add", "short", ref_audio(), 16000)
    with pytest.raises(InferenceServerException, match=r"VOICE_MODE must be one of .*, got 'z{80}'\.\.\. \(4000 c"):
        stream_infer(server, "tts_stream", _inputs(grpcclient, TEXT, VOICE=_b("short"), VOICE_MODE=_b("z" * 4000),
                                                   **GEN))
    voices(server, "remove", "short")


def test_64_characters_is_a_name(server):
    assert voices(server, "add", "v" * 64, ref_audio(), 16000) == ["v" * 64]
    assert voices(server, "remove", "v" * 64) == []


def test_add_checks_audio_like_reference_audio(server):
    cases = {"AUDIO is empty": (np.zeros(0, np.float32), 16000),
             "AUDIO contains NaN or Inf": (np.full(100, np.nan, np.float32), 16000),
             r"AUDIO is 61000 samples \(61 s\) at 1000 Hz; the limit is 60 s": (np.zeros(61 * 1000, np.float32), 1000),
             "SAMPLE_RATE 10 is outside": (np.zeros(100, np.float32), 10),
             "AUDIO: its encoding overflows": (np.full(16000, 3e38, np.float32), 16000)}
    for message, (audio, rate) in cases.items():
        with pytest.raises(InferenceServerException, match=message) as info:
            voices(server, "add", "bad", audio, rate)
        assert info.value.status() == "400", (message, info.value.status())
    with pytest.raises(InferenceServerException, match="ACTION add needs AUDIO and SAMPLE_RATE"):
        voices(server, "add", "bad")
    with pytest.raises(InferenceServerException, match="ACTION must be one of add, remove, list"):
        voices(server, "rename", "bad")
    # no ACTION beside inputs that may be left out: Triton lets it through (its count is not short)
    with pytest.raises(InferenceServerException, match=r"^\[400\] ACTION is required: one of add, remove, list$"):
        voices(server, None, "bad", text="words")
    assert voices(server, "list") == []


@pytest.mark.parametrize("mode", ["reference", "continuation", "both"])
def test_voice_equals_the_same_audio_inline(server, mode):
    audio = ref_audio(3)
    voices(server, "add", "same", audio, 16000, TRANSCRIPT)
    inline = {}
    if mode in ("reference", "both"):
        inline.update(REFERENCE_AUDIO=audio, REFERENCE_SAMPLE_RATE=16000)
    if mode in ("continuation", "both"):
        inline.update(PROMPT_AUDIO=audio, PROMPT_SAMPLE_RATE=16000, PROMPT_TEXT=TRANSCRIPT)
    want, _ = tts_http(server, TEXT, **inline, **GEN)
    extra = {} if mode == "reference" else {"VOICE_MODE": _b(mode)}  # reference is the default
    got, rate = tts_http(server, TEXT, VOICE=_b("same"), **extra, **GEN)
    assert rate == 48000 and got.shape == want.shape and np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # the same through tts_stream (gRPC)
    from tests.test_server import grpcclient
    chunks = stream_infer(server, "tts_stream", _inputs(grpcclient, TEXT, VOICE=_b("same"), **extra, **GEN))
    np.testing.assert_allclose(np.concatenate(chunks), want, atol=TOL, rtol=0)
    if mode == "reference":  # other voices and other seeds differ: the comparison means something
        other, _ = tts_http(server, TEXT, REFERENCE_AUDIO=ref_audio(4), REFERENCE_SAMPLE_RATE=16000, **GEN)
        assert np.abs(other - want).max() > 1e-3
    voices(server, "remove", "same")


def test_a_replaced_voice_is_read_again(server):
    voices(server, "add", "changing", ref_audio(5), 16000)
    first, _ = tts_http(server, TEXT, VOICE=_b("changing"), **GEN)  # cached by the tts instance now
    voices(server, "add", "changing", ref_audio(6), 16000)
    want, _ = tts_http(server, TEXT, REFERENCE_AUDIO=ref_audio(6), REFERENCE_SAMPLE_RATE=16000, **GEN)
    for _ in range(3):  # several tts instances: whichever serves it sees the new voice
        got, _ = tts_http(server, TEXT, VOICE=_b("changing"), **GEN)
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    assert np.abs(first - want).max() > 1e-3
    voices(server, "remove", "changing")


def test_voice_errors(server):
    voices(server, "add", "plain", ref_audio(), 16000)  # no transcript
    ref = dict(REFERENCE_AUDIO=ref_audio(), REFERENCE_SAMPLE_RATE=16000)
    prompt = dict(PROMPT_AUDIO=ref_audio(), PROMPT_SAMPLE_RATE=16000, PROMPT_TEXT=TRANSCRIPT)
    cases = [
        (dict(VOICE=_b("nobody")), "unknown voice 'nobody'"),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("continuation")),
         re.escape("voice 'plain' has no transcript, so it cannot serve VOICE_MODE continuation; add it again with "
                   "its transcript (the voices model's TEXT, the OpenAI gateway's ref_text), or use VOICE_MODE reference")),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("both")), "cannot serve VOICE_MODE both"),
        (dict(VOICE=_b("plain"), **ref), "VOICE with VOICE_MODE reference is the reference: leave out REFERENCE_AUDIO"),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("both"), **ref), "leave out REFERENCE_AUDIO"),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("continuation"), **prompt), "leave out PROMPT_AUDIO"),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("both"), **prompt), "leave out"),
        (dict(VOICE_MODE=_b("reference")), "VOICE_MODE was given without VOICE"),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("prompt")), "VOICE_MODE must be one of reference, continuation, both"),
        (dict(VOICE=_b("plain"), VOICE_MODE=_b("")), "VOICE_MODE must be one of reference, continuation, both"),
    ]
    for params, message in cases:
        with pytest.raises(InferenceServerException, match=message):
            tts_http(server, TEXT, **params, **GEN)
    # a voice in one role, inline audio in the other: allowed
    audio, _ = tts_http(server, TEXT, VOICE=_b("plain"), **prompt, **GEN)
    assert audio.size
    voices(server, "remove", "plain")


def test_concurrent_adds_lose_nothing(server):
    names = [f"c{i}" for i in range(8)]
    errors = []

    def add(i):
        try:
            voices(server, "add", names[i], ref_audio(i), 16000, TRANSCRIPT if i % 2 else None)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert voices(server, "list") == names
    # and concurrent removes
    threads = [threading.Thread(target=voices, args=(server, "remove", n)) for n in names[:4]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert voices(server, "list") == names[4:]
    for n in names[4:]:
        voices(server, "remove", n)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_client_cli_voices(server, tmp_path, protocol):
    import soundfile as sf

    wav = tmp_path / "ref.wav"
    sf.write(str(wav), ref_audio(7), 16000, subtype="FLOAT")
    url = server.grpc_url if protocol == "grpc" else server.http_url
    env = {**os.environ, "PYTHONPATH": str(REPO / "client")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "voxcpm_client", "voices", *args, "--protocol", protocol,
                               "--url", url], capture_output=True, text=True, env=env, timeout=300)

    r = cli("add", "cli-voice", str(wav), "--text", TRANSCRIPT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cli-voice"]
    assert cli("list").stdout.split() == ["cli-voice"]
    out = tmp_path / "out.wav"
    r = subprocess.run([sys.executable, "-m", "voxcpm_client", TEXT, "--protocol", protocol, "--url", url,
                        "--voice", "cli-voice", "--voice-mode", "both", "--seed", "1", "--min-length", "2",
                        "--max-length", "2", "-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0
    r = cli("remove", "cli-voice")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "no voices are stored\n", r.stderr
    r = cli("remove", "cli-voice")
    assert r.returncode == 2 and "unknown voice 'cli-voice'" in r.stderr
    r = cli("add", "../evil", str(wav))
    assert r.returncode == 2 and NAME_ERROR in r.stderr


def test_library_voice_params(server):
    voxcpm_client.add_voice("lib", ref_audio(8), 16000, text=TRANSCRIPT, url=server.http_url)
    assert voxcpm_client.list_voices(url=server.grpc_url, protocol="grpc") == ["lib"]
    r = voxcpm_client.synthesize(TEXT, url=server.http_url, voice="lib", voice_mode="continuation", seed=2,
                                 min_length=2, max_length=2)
    s = voxcpm_client.synthesize_stream(TEXT, url=server.grpc_url, voice="lib", voice_mode="continuation", seed=2,
                                        min_length=2, max_length=2)
    np.testing.assert_allclose(s.audio, r.audio, atol=TOL, rtol=0)
    assert voxcpm_client.remove_voice("lib", url=server.grpc_url, protocol="grpc") == []


def test_a_second_request_with_the_same_voice_starts_from_the_decoders_prefix_cache(server):
    """The decoder's metrics: a voice's first request fills the prefix cache, the next (another
    seed) reuses its leading KV blocks instead of prefilling them."""
    from tests.test_server import metrics

    def hits():  # the metrics are published a few times a second
        m = metrics(server)
        return m["voxcpm_prefix_cache_hits_total"], m["voxcpm_prefix_cache_hit_blocks_total"]

    def published(want_hits=None):
        """Once earlier requests are in the metrics: two reads 0.6 s apart agree (and show want_hits)."""
        deadline, prev = time.monotonic() + 10, hits()
        while time.monotonic() < deadline:
            time.sleep(0.6)
            now = hits()
            if now == prev and want_hits in (None, now[0]):
                break
            prev = now
        return now

    voices(server, "add", "cached", sine_wave(2.0, 16000, freq=210, seed=12), 16000)  # 2 s: full blocks of voice
    try:
        before = published()
        tts_http(server, TEXT, VOICE=_b("cached"), **GEN)
        assert published() == before, "a new voice's first request cannot hit"
        tts_http(server, TEXT, VOICE=_b("cached"), SEED=12, MIN_LENGTH=2, MAX_LENGTH=2)
        after = published(before[0] + 1)
        assert after[0] == before[0] + 1 and after[1] > before[1], (before, after)
    finally:
        voices(server, "remove", "cached")


def test_voices_survive_a_restart(server, triton_server_factory, env):  # noqa: F811  (keep last: stops `server`)
    audio = ref_audio(9)
    voices(server, "add", "kept", audio, 16000, TRANSCRIPT)
    want, _ = tts_http(server, TEXT, VOICE=_b("kept"), VOICE_MODE=_b("both"), **GEN)
    server.stop()
    again = triton_server_factory("model_repository", env=env)
    assert voices(again, "list") == ["kept"]
    got, _ = tts_http(again, TEXT, VOICE=_b("kept"), VOICE_MODE=_b("both"), **GEN)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    inline, _ = tts_http(again, TEXT, REFERENCE_AUDIO=audio, REFERENCE_SAMPLE_RATE=16000, PROMPT_AUDIO=audio,
                         PROMPT_SAMPLE_RATE=16000, PROMPT_TEXT=TRANSCRIPT, **GEN)
    np.testing.assert_allclose(got, inline, atol=TOL, rtol=0)


def test_the_store_bounds_the_number_of_voices(tmp_path):
    """Clients can add voices: past `max_voices` a new name is refused, replacing one is not."""
    from voxcpm_triton.serving.triton_io import Busy
    from voxcpm_triton.serving.voices import VoiceStore

    store = VoiceStore(str(tmp_path / "voices"))
    lat = np.zeros((3, 4, 16), np.float32)
    assert store.add("a", lat, None, None, 16000, max_voices=2) == ["a"]
    assert store.add("b", lat, None, None, 16000, max_voices=2) == ["a", "b"]
    with pytest.raises(Busy, match="2 voices are stored already, the most allowed is 2 .*max_voices"):
        store.add("c", lat, None, None, 16000, max_voices=2)
    with pytest.raises(Busy, match="2 voices are stored already, the most allowed is 1 "):  # a limit lowered since
        store.add("c", lat, None, None, 16000, max_voices=1)
    assert store.add("b", lat + 1, None, None, 16000, max_voices=2) == ["a", "b"]  # a replacement
    assert float(store.load("b").reference[0, 0, 0]) == 1.0
    store.remove("a")
    assert store.add("c", lat, None, None, 16000, max_voices=2) == ["b", "c"]
    assert sorted(os.listdir(tmp_path / "voices" / ".store")) and not [
        n for n in os.listdir(tmp_path / "voices" / ".store") if n.startswith(".tmp")]


def test_an_add_is_not_failed_by_another_writers_temp_going_while_it_sweeps(tmp_path, monkeypatch):
    """The sweep after an add (under the lock) reads the age of every temp it lists; another process
    removes its own temp outside the lock (its add failed), so one listed may be gone when it is read:
    that failed the add already stored (FileNotFoundError, a review)."""
    from voxcpm_triton.serving import voices as voices_module
    from voxcpm_triton.serving.voices import VoiceStore

    store = VoiceStore(str(tmp_path / "voices"))
    lat = np.zeros((3, 4, 16), np.float32)
    store.add("a", lat, None, None, 16000)
    listdir = os.listdir
    monkeypatch.setattr(voices_module.os, "listdir", lambda d: listdir(d) + [".tmp-gone-meanwhile"])
    assert store.add("b", lat, None, None, 16000) == ["a", "b"]
    monkeypatch.undo()
    assert store.names() == ["a", "b"] and store.load("b").sample_rate == 16000


def test_a_link_the_store_did_not_make_is_no_voice_and_a_damaged_voice_is_named(tmp_path):
    """A link put into the voices directory by hand (`evil` -> a directory elsewhere) is neither
    listed, read nor removed, and replacing that name deletes nothing outside the store. A voice
    whose files were damaged fails with its name, not a path or a parser's bare message."""
    from voxcpm_triton.serving.triton_io import InputError
    from voxcpm_triton.serving.voices import VoiceStore

    root, outside = tmp_path / "voices", tmp_path / "elsewhere"
    store = VoiceStore(str(root))
    lat = np.zeros((3, 4, 16), np.float32)
    store.add("a", lat, None, None, 16000)
    outside.mkdir()
    (outside / "keep.txt").write_text("not the store's")
    os.symlink(str(outside), str(root / "evil"))
    assert store.names() == ["a"]
    for call in (store.load, store.remove):
        with pytest.raises(InputError, match="unknown voice 'evil'"):
            call("evil")
    assert store.add("evil", lat, None, None, 16000) == ["a", "evil"]
    assert (outside / "keep.txt").read_text() == "not the store's"

    latents = os.path.join(os.path.realpath(str(root / "a")), "latents.safetensors")
    with open(latents, "wb") as f:
        f.write(os.urandom(64))
    with pytest.raises(RuntimeError, match=r"the voice store cannot read voice 'a' \(.+\); remove it") as info:
        VoiceStore(str(root)).load("a")  # (another process: nothing cached)
    assert str(tmp_path) not in str(info.value)
    assert store.remove("a") == ["evil"]


def test_a_voice_whose_version_is_gone_is_not_listed_and_goes_at_the_next_change(tmp_path):
    """Its files removed by hand (or the whole .store): the link is neither listed nor counted; it can
    be deleted, and the next add sweeps what is left of it."""
    from voxcpm_triton.serving.triton_io import InputError
    from voxcpm_triton.serving.voices import VoiceStore

    import shutil

    store = VoiceStore(str(tmp_path))
    lat = np.zeros((2, 4, 3), np.float32)
    store.add("a", lat, None, None, 16000)
    store.add("b", lat, None, None, 16000)
    shutil.rmtree(os.path.realpath(str(tmp_path / "a")))
    assert store.names() == ["b"]
    store.check_room("c", max_voices=2)  # one voice stored, not two
    with pytest.raises(InputError, match="unknown voice 'a'"):
        store.load("a")
    store.add("c", lat, None, None, 16000)
    assert not os.path.lexists(str(tmp_path / "a")) and store.names() == ["b", "c"]
    shutil.rmtree(os.path.realpath(str(tmp_path / "b")))
    assert store.remove("b") == ["c"] and not os.path.lexists(str(tmp_path / "b"))


def test_removing_an_unknown_voice_says_so_before_taking_the_lock(tmp_path, monkeypatch):
    """The lock file is opened for writing: on a read-only store that failed first (a 500 for a 404)."""
    from voxcpm_triton.serving.triton_io import InputError
    from voxcpm_triton.serving.voices import VoiceStore

    store = VoiceStore(str(tmp_path))
    store.add("a", np.zeros((2, 4, 3), np.float32), None, None, 16000)

    def read_only():
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(store, "_locked", read_only)
    with pytest.raises(InputError, match="unknown voice 'nope'"):
        store.remove("nope")


def test_a_voice_read_stuck_on_its_disk_fails_its_request_and_holds_nothing_else(tmp_path, monkeypatch):
    """load_async: a read that never returns fails after its timeout while the event loop goes on;
    once READERS reads are stuck, the next ones fail too (no more threads join them); a read that
    returns later is not lost to the next request."""
    from voxcpm_triton.serving.voices import VoiceStore

    import asyncio
    import threading

    from voxcpm_triton.serving import voices

    store = VoiceStore(str(tmp_path))
    store.add("a", np.zeros((2, 4, 3), np.float32), None, None, 16000)
    release = threading.Event()
    real = store.load

    def stuck(name):
        release.wait(30)
        return real(name)

    monkeypatch.setattr(store, "load", stuck)

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        errors = await asyncio.gather(*(store.load_async("a", timeout=1.0) for _ in range(voices.READERS + 2)),
                                      return_exceptions=True)
        ticker.cancel()
        return ticks, errors

    try:
        ticks, errors = asyncio.run(main())
    finally:
        release.set()
    assert ticks >= 10  # the loop ran meanwhile
    messages = sorted(str(e) for e in errors)
    assert all(isinstance(e, RuntimeError) and str(tmp_path) not in str(e) for e in errors), errors
    assert sum("did not answer in 1 s reading voice 'a'" in m for m in messages) == voices.READERS, messages
    assert sum(f"{voices.READERS} reads of it are stuck" in m for m in messages) == 2, messages
    monkeypatch.setattr(store, "load", real)
    deadline = time.monotonic() + 10
    while store._readers._value < voices.READERS:  # the stuck ones have let go
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert asyncio.run(store.load_async("a")).name == "a"


def test_the_store_keeps_a_voices_default_adapter(tmp_path):
    """A voice's LoRA adapter is in its voice.json, read back by another store (another process);
    replacing the voice replaces it; a voice stored before adapters existed has none."""
    import json

    from voxcpm_triton.serving.voices import VoiceStore

    lat = np.zeros((3, 4, 16), np.float32)
    VoiceStore(str(tmp_path)).add("n", lat, None, None, 16000, lora="narrator")
    assert VoiceStore(str(tmp_path)).load("n").lora == "narrator"
    VoiceStore(str(tmp_path)).add("n", lat, None, None, 16000)
    assert VoiceStore(str(tmp_path)).load("n").lora is None
    VoiceStore(str(tmp_path)).add("n", lat, None, None, 16000, lora="narrator")
    meta_path = os.path.join(os.path.realpath(tmp_path / "n"), "voice.json")
    with open(meta_path) as f:
        meta = json.load(f)
    assert meta["lora"] == "narrator"
    del meta["lora"]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    assert VoiceStore(str(tmp_path)).load("n").lora is None
