"""Serving under pressure and abuse, through a real tritonserver on loopback (tiny checkpoint, CPU).

A "tight" repository makes the limits easy to reach: the decoder runs one request at a time
and queues one more, tts_stream has a single instance, vae_decoder holds two streams.
"""

import glob
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest

from tests.conftest import require_module  # noqa: E402

tritonclient = require_module("tritonclient", "tritonclient[all] in requirements.txt")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.server import REPO, edited_repository, remove_shm_regions, triton_server_factory  # noqa: E402,F401
from tests.test_server import _inputs, metrics, tts_stream  # noqa: E402
from voxcpm_triton.coordination import liveness, run_state, runtime  # noqa: E402
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

P, D = TINY_CONFIG["patch_size"], TINY_CONFIG["feat_dim"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("tight_ckpt")), TINY_CONFIG, seed=5, progress=None)


@pytest.fixture(scope="module")
def tight(triton_server_factory, ckpt, tmp_path_factory):  # noqa: F811
    repo = edited_repository(tmp_path_factory.mktemp("tight") / "repo",
                              parameters={"decoder": {"max_num_seqs": "1", "max_waiting_requests": "1"},
                                          "vae_decoder": {"max_streams": "2"},
                                          "tts_stream": {"max_normalize_waiting": "1"}},
                              instances={"tts_stream": 1})
    cfg = repo / "text_normalizer" / "config.pbtxt"
    text, n = re.subn(r"max_queue_size: \d+", "max_queue_size: 1", cfg.read_text())
    assert n == 1, cfg
    cfg.write_text(text)
    return triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})


def wait_for(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Stream:
    """One gRPC stream on tts_stream in the background, with each chunk's arrival time."""

    def __init__(self, server, text, **params):
        self.times: list = []
        self.chunks: list = []
        self.error = None
        self.done = threading.Event()
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=self._on)
        self.client.async_stream_infer("tts_stream", _inputs(grpcclient, text, **params),
                                       enable_empty_final_response=True)

    def _on(self, result, error):
        if error is not None:
            self.error = error
            self.done.set()
        elif result.get_response().parameters["triton_final_response"].bool_param:
            self.done.set()
        else:
            self.times.append(time.monotonic())
            self.chunks.append(result.as_numpy("AUDIO"))

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _vae(server, corrid, patches, start=False, end=False, key=True):
    """One raw vae_decoder request (a client pretending to be the orchestrator, or not)."""
    c = httpclient.InferenceServerClient(server.http_url)
    try:
        lat = np.random.default_rng(corrid).standard_normal((1, patches, P, D)).astype(np.float32)
        t = httpclient.InferInput("LATENTS", list(lat.shape), "FP32")
        t.set_data_from_numpy(lat)
        params = {"voxcpm_internal_key": server.internal_key} if key else None
        return c.infer("vae_decoder", [t], sequence_id=corrid, sequence_start=start, sequence_end=end,
                       parameters=params).as_numpy("AUDIO")
    finally:
        c.close()


def test_a_running_stream_keeps_its_rhythm_while_another_waits_for_the_decoder(tight):
    """The decoder runs one request at a time: B waits for admission until A is done. A's audio
    must keep flowing meanwhile (it used to stop for B's whole wait), and a third request finds
    the waiting queue full and is told the server is busy."""
    a = Stream(tight, "The first stream, long enough to be running for a while.", SEED=1,
               MIN_LENGTH=600, MAX_LENGTH=600)
    b = c = None
    try:
        wait_for(lambda: len(a.times) >= 3 or a.done.is_set(), what="A's first chunks")
        assert a.error is None, a.error
        b = Stream(tight, "The second stream.", SEED=2, MIN_LENGTH=3, MAX_LENGTH=3)
        wait_for(lambda: metrics(tight).get("voxcpm_engine_waiting_requests") == 1, what="B queued in the decoder")
        t_b = time.monotonic()
        c = Stream(tight, "A third one.", SEED=3, MIN_LENGTH=3, MAX_LENGTH=3)
        assert c.done.wait(60) and c.error is not None
        assert "server busy" in str(c.error) and "max_waiting_requests" in str(c.error), c.error
        assert a.done.wait(300) and b.done.wait(300)
        assert a.error is None and b.error is None, (a.error, b.error)
        assert sum(x.size for x in a.chunks) == 600 * P * 1920
        # B was queued behind A all along: its first audio comes after all but A's last two chunks.
        # Those can share the audio thread's last round with B's first chunk, which the decoder's
        # audio rush (default) sends between that round's deliveries: B's client has no audio yet.
        assert b.times[0] > a.times[-3]
        during = [t_b] + [t for t in a.times if t > t_b]
        assert len(during) >= 5, "A finished before B's wait could be observed"
        wait_s, max_gap = during[-1] - t_b, max(np.diff(during))
        assert max_gap < 0.5 * wait_s, f"A stalled for {max_gap:.1f} s of B's {wait_s:.1f} s wait"
    finally:
        for s in (a, b, c):
            if s is not None:
                s.close(cancel=True)


def test_normalize_requests_wait_apart_from_plain_ones_and_past_the_queue_bound_are_busy(tight):
    """NORMALIZE runs in text_normalizer, not in the tokenizer that every request passes. Five
    requests with 4 KB of digits to normalise (over a second each) sent at once: one is normalised,
    one waits (max_queue_size 1 on this server), the rest are refused at once as busy; a plain
    request sent after them gets its audio before the first of them, as if they were not there."""
    from tests.test_server import tts_http

    slow = "1 " * 2000
    params = dict(SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)
    results: dict = {}

    def run(name, text, **kw):
        try:
            out = tts_http(tight, text, **params, **kw)[0]
        except InferenceServerException as e:
            out = e
        results[name] = (out, time.monotonic())

    threads = [threading.Thread(target=run, args=(i, slow), kwargs={"NORMALIZE": ("BOOL", np.array([True]))})
               for i in range(5)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    time.sleep(0.3)
    run("plain", "I paid $5 for 3 apples.")
    for t in threads:
        t.join(120)
    normalised = [i for i in range(5) if isinstance(results[i][0], np.ndarray)]
    busy = [results[i][0] for i in range(5) if i not in normalised]
    assert len(normalised) >= 2 and busy, results
    for e in busy:
        assert "too many NORMALIZE requests" in str(e) and e.status() == "503", e  # UNAVAILABLE: retry later
    assert isinstance(results["plain"][0], np.ndarray), results["plain"]
    assert results["plain"][1] < min(results[i][1] for i in normalised), results


def test_normalize_streams_past_their_instances_waiting_bound_are_busy(tight):
    """tts_stream holds no instance while a NORMALIZE request waits, and its 2 calls in flight fit
    text_normalizer's queue: the flood waited in the orchestrator without bound (30 requests took
    0.8 to 21.6 s, none refused). Five at once with max_normalize_waiting 1: 2 in flight, 1 waiting,
    the rest refused at once as busy, naming the parameter. (The one waiting may still be refused by
    text_normalizer's own queue, 1 here, when its slot frees before Triton has taken the next request
    off that queue: a CI run saw it.)"""
    slow = "1 " * 2000
    results: dict = {}

    def run(i):
        try:
            results[i] = (tts_stream(tight, slow, SEED=1, MIN_LENGTH=2, MAX_LENGTH=2,
                                     NORMALIZE=("BOOL", np.array([True]))), time.monotonic())
        except InferenceServerException as e:
            results[i] = (e, time.monotonic())

    run("first")  # text_normalizer idle (its queue holds 1 here): what an earlier test sent is done
    assert isinstance(results.pop("first")[0], list), "a lone NORMALIZE stream is served"
    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(120)
    busy = {i: r for i, (r, _) in results.items() if isinstance(r, InferenceServerException)}
    served = [t for r, t in results.values() if not isinstance(r, InferenceServerException)]
    assert len(results) == 5 and len(served) >= 2, results
    assert all("too many NORMALIZE requests" in str(e) for e in busy.values()), busy
    bound = [i for i, e in busy.items() if "max_normalize_waiting" in str(e)]
    assert len(bound) >= 1, busy  # none before: every stream waited its turn
    assert max(results[i][1] for i in bound) < min(served), "refused at once, before any stream was served"


def test_internal_models_refuse_clients(tight):
    """Only the orchestrator (which stamps the server's internal key) may call the internal models;
    a refused vae_decoder START holds no stream state."""
    c = httpclient.InferenceServerClient(tight.http_url)

    def inp(name, dt, arr):
        t = httpclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        return t

    calls = {
        "tokenizer": [inp("TEXT", "BYTES", np.array([b"hi"], dtype=object))],
        "text_normalizer": [inp("TEXT", "BYTES", np.array([[b"$5"]], dtype=object))],
        "vae_encoder": [inp("AUDIO", "FP32", np.zeros((1, 1600), np.float32)),
                        inp("SAMPLE_RATE", "INT32", np.array([[16000]], np.int32)),
                        inp("PAD_LEFT", "BOOL", np.array([[False]]))],
    }
    try:
        for model, inputs in calls.items():
            for params in (None, {"voxcpm_internal_key": "guess"}):
                with pytest.raises(InferenceServerException, match="is internal to the VoxCPM pipeline"):
                    c.infer(model, inputs, parameters=params)
        with pytest.raises(InferenceServerException, match="is internal to the VoxCPM pipeline"):
            tts_stream_direct_decoder(tight)
        for corrid in range(300, 304):
            with pytest.raises(InferenceServerException, match="is internal to the VoxCPM pipeline"):
                _vae(tight, corrid, 1, start=True, key=False)
        assert metrics(tight)["voxcpm_vae_streams"] == 0
        for corrid in range(300, 304):  # Triton's sequence batcher holds them until END (or its idle timeout)
            with pytest.raises(InferenceServerException, match="is internal to the VoxCPM pipeline"):
                _vae(tight, corrid, 0, end=True, key=False)
        # vae_encoder takes one waveform per request, even from the orchestrator
        key = {"voxcpm_internal_key": tight.internal_key}
        two = [inp("AUDIO", "FP32", np.zeros((2, 1600), np.float32)),
               inp("SAMPLE_RATE", "INT32", np.array([[16000], [16000]], np.int32)),
               inp("PAD_LEFT", "BOOL", np.array([[False], [False]]))]
        with pytest.raises(InferenceServerException, match="batch dimension of 1"):
            c.infer("vae_encoder", two, parameters=key)
        long = [inp("AUDIO", "FP32", np.zeros((1, 16000 * 61), np.float32)),
                inp("SAMPLE_RATE", "INT32", np.array([[16000]], np.int32)),
                inp("PAD_LEFT", "BOOL", np.array([[False]]))]
        with pytest.raises(InferenceServerException, match="the limit is 60 s"):
            c.infer("vae_encoder", long, parameters=key)
    finally:
        c.close()


def tts_stream_direct_decoder(server):
    t = grpcclient.InferInput("TOKEN_IDS", [3], "INT64")
    t.set_data_from_numpy(np.array([5, 6, 7], np.int64))
    n = grpcclient.InferInput("TARGET_TOKENS", [1], "INT32")
    n.set_data_from_numpy(np.array([1], np.int32))
    from tests.test_server import stream_infer

    return stream_infer(server, "decoder", [t, n], output="LATENTS")


def test_vae_stream_lifecycle(tight):
    """START opens (at most max_streams), a chunk of an unknown stream is an error (no silent fresh
    state), an END for a stream whose START failed is harmless, and END frees the slot."""
    assert _vae(tight, 101, 1, start=True).shape == (1, P * 1920)
    assert _vae(tight, 102, 1, start=True).shape == (1, P * 1920)
    with pytest.raises(InferenceServerException, match="VAE stream slots are in use"):
        _vae(tight, 103, 1, start=True)
    # Triton still counts sequence 103 as open; the model does not know it.
    with pytest.raises(InferenceServerException, match="sequence 103 has no open VAE stream"):
        _vae(tight, 103, 1)
    assert _vae(tight, 103, 0, end=True).shape == (1, 0)
    assert metrics(tight)["voxcpm_vae_streams"] == 2
    # With every vae_decoder slot held, synthesis still works: the decoder makes the audio
    # (decode_audio, the default) and frees its own stream state.
    assert sum(c.size for c in tts_stream(tight, "Room anyway.", SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)) == 2 * P * 1920
    wait_for(lambda: metrics(tight)["voxcpm_decoder_audio_streams"] == 0, what="the decoder's audio state released")
    for corrid in (101, 102):
        _vae(tight, corrid, 0, end=True)
    assert metrics(tight)["voxcpm_vae_streams"] == 0


def test_full_vae_decoder_fails_a_synthesis_cleanly(triton_server_factory, ckpt, tmp_path):  # noqa: F811
    """The pipeline through vae_decoder (decode_audio false): with both of its slots held, a synthesis
    fails cleanly (its START is refused); once they are free, synthesis works again and leaves no
    state behind."""
    repo = edited_repository(tmp_path / "repo", parameters={"decoder": {"decode_audio": "false"},
                                                             "vae_decoder": {"max_streams": "2"}})
    srv = triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})
    for corrid in (101, 102):
        _vae(srv, corrid, 1, start=True)
    with pytest.raises(InferenceServerException, match="VAE stream slots are in use"):
        tts_stream(srv, "No room.", SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)
    for corrid in (101, 102):
        _vae(srv, corrid, 0, end=True)
    assert metrics(srv)["voxcpm_vae_streams"] == 0
    assert sum(c.size for c in tts_stream(srv, "Room again.", SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)) == 2 * P * 1920
    wait_for(lambda: metrics(srv)["voxcpm_vae_streams"] == 0, what="VAE state released")


def test_a_cancelled_tts_request_stops_decoding(tight):
    """`tts` (whole utterance) polls its client's cancellation: a gRPC client that gives up frees
    the decoder long before the utterance would have ended."""
    c = grpcclient.InferenceServerClient(tight.grpc_url)
    done: queue.Queue = queue.Queue()
    try:
        steps0 = metrics(tight)["voxcpm_engine_decode_steps_total"]
        ctx = c.async_infer("tts", _inputs(grpcclient, "Cancel me.", SEED=1, MIN_LENGTH=3000, MAX_LENGTH=3000),
                            callback=lambda result, error: done.put((result, error)))
        wait_for(lambda: metrics(tight)["voxcpm_engine_running_requests"] == 1, what="decoding to start")
        ctx.cancel()
        wait_for(lambda: metrics(tight)["voxcpm_engine_running_requests"] == 0, timeout=60, what="decoder freed")
        assert metrics(tight)["voxcpm_engine_decode_steps_total"] - steps0 < 2500
        _, error = done.get(timeout=30)
        assert error is not None and "CANCELLED" in str(error).upper()
    finally:
        c.close()


# --- a model process killed under load: scripts/serve.sh's supervisor brings the service back ---------


def _shm_regions(mark: str) -> set[str]:
    """The python backend's shared-memory regions named on the command lines of the marked model processes
    (the supervisor's guard names their prefix)."""
    return {a for _, cmd in _marked(mark) if "triton_python_backend_stub" in cmd for a in cmd.split()
            if a.startswith("triton_python_backend_shm_region_")}


def _marked(mark: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries VOXCPM_TEST_MARK=mark: all the test started."""
    from tests.server import _cmdline

    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if f"VOXCPM_TEST_MARK={mark}".encode() not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            out.append((int(d), _cmdline(int(d))))
    return out


def _open_files(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    return out


def _kill_marked(mark: str):
    """SIGKILL every live process the test marked (what a failed test would otherwise leave), then
    remove the shared-memory regions they named, which nobody else would."""
    regions = _shm_regions(mark)
    for pid, _ in _marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    remove_shm_regions(regions)


@pytest.mark.parametrize("fault", ["killed", "frozen", "tts_stream_killed"])
def test_a_dead_or_frozen_decoder_fails_its_streams_and_the_supervisor_restores_service(ckpt, tmp_path, fault):
    """With 4 streams in flight the decoder's process is killed (SIGKILL, as an OOM kill would) or
    frozen (SIGSTOP: alive, answering nothing, as a hung engine would be), or one of the tts_stream
    instances' processes is killed: every client gets an error instead of hanging (within seconds of
    a kill; once its beacon is stale when frozen), the server stops being ready, and scripts/serve.sh's
    supervisor has it serving again without anybody's help, with the LoRA adapters it had at run time
    (killed: one of three removed before; a restart used to load the directory's again). (A dead tts_stream process once left the
    decoder's audio thread waiting for good on a response to it, and every stream with it.) Then SIGTERM after that traffic stops everything the server started, and no
    model process's shared-memory region is left in /dev/shm (the supervisor removes those of the
    server it stopped by force)."""
    from tests.server import _free_ports, triton_env
    from tests.test_server import tts_http

    mark = uuid.uuid4().hex
    http, grpc, metrics_port = _free_ports(3)
    env = triton_env()
    env.update(SKIP_SETUP="1", VOXCPM_CHECKPOINT=ckpt, TRITON_HTTP_PORT=str(http), TRITON_GRPC_PORT=str(grpc),
               TRITON_METRICS_PORT=str(metrics_port), VOXCPM_PROBE_INTERVAL="2", VOXCPM_TEST_MARK=mark,
               TRITON_EXIT_TIMEOUT="20", OPENAI_API_PORT="0")  # no gateway: not what this is about
    if fault == "tts_stream_killed":
        # No probes: the supervisor restarts on the dead process's beacon. The streams that process held
        # have nobody left to end them but a restart (before, with probes off they waited for good).
        env["VOXCPM_PROBE_INTERVAL"] = "0"
    if fault == "killed":
        from tests.lora_helpers import write_adapters
        from tests.test_lora_served import loras

        lora_dir = tmp_path / "loras"
        write_adapters(ckpt, str(lora_dir), names=("lm_dit",))
        for name in ("a", "b", "c"):
            shutil.copytree(lora_dir / "lm_dit", lora_dir / name)
        shutil.rmtree(lora_dir / "lm_dit")
        env["VOXCPM_LORA_DIR"] = str(lora_dir)

    class Srv:
        http_url, grpc_url = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"

    def ready():
        try:
            with urllib.request.urlopen(f"http://{Srv.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "serve.sh")], env=env, stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    streams = []
    try:
        wait_for(ready, timeout=240, what=f"the server to start\n{log.read_text()[-3000:]}")
        if fault == "killed":
            assert loras(Srv, "remove", "b") == ["a", "c"]
        streams = [Stream(Srv, f"Stream number {i}, which goes on and on.", SEED=i, MIN_LENGTH=3000,
                          MAX_LENGTH=3000) for i in range(4)]
        wait_for(lambda: all(len(s.times) >= 2 for s in streams), what="audio on all four streams")
        victim = "/tts_stream/1/model.py" if fault == "tts_stream_killed" else "/decoder/1/model.py"
        pid = [p for p, cmd in _marked(mark) if victim in cmd][0]
        regions = _shm_regions(mark)
        assert len(regions) >= 5 and all(os.path.exists(f"/dev/shm/{r}") for r in regions), regions
        os.kill(pid, signal.SIGSTOP if fault == "frozen" else signal.SIGKILL)
        t_kill = time.monotonic()
        for s in streams:
            wait = 15 if fault == "tts_stream_killed" else 30 + liveness.BEACON_STALE_S
            assert s.done.wait(max(0.0, wait - (time.monotonic() - t_kill))), \
                f"a client was left hanging after the decoder was {fault}\n{log.read_text()[-3000:]}"
        # Killed while it held one of python_backend's interprocess locks, the stub takes the whole
        # tritonserver 2.51 down with it (lock_exception in the backend's execute, SIGABRT): then every
        # client's stream is cut (UNAVAILABLE), and the supervisor restores service as below.
        server_aborted = fault != "frozen" and "boost::interprocess::lock_exception" in log.read_text()
        for s in streams:
            if server_aborted:
                assert s.error is not None and "UNAVAILABLE" in str(s.error), s.error
            else:  # its own health check's error, or cut by the supervisor's restart, whichever comes first
                victim_name = "tts_stream" if fault == "tts_stream_killed" else "decoder"
                assert s.error is not None and (
                    "UNAVAILABLE" in str(s.error) or "shutting down" in str(s.error)
                    or ("unhealthy" in str(s.error) and victim_name in str(s.error))), s.error
        errors_after = time.monotonic() - t_kill
        wait_for(lambda: not ready(), timeout=60, what="readiness to turn false")
        restored = None
        while restored is None:
            assert time.monotonic() - t_kill < 240, f"not serving again 240 s after the kill\n{log.read_text()[-3000:]}"
            try:
                audio, _ = tts_http(Srv, "Back again.", SEED=1, MIN_LENGTH=2, MAX_LENGTH=2)
                restored = time.monotonic() - t_kill
            except Exception:  # noqa: BLE001 - down or still loading
                time.sleep(0.5)
        assert audio.shape == (2 * P * 1920,)
        if fault == "killed":
            assert loras(Srv, "list") == ["a", "c"]
        print(f"{fault}: errors {errors_after:.1f} s and service back {restored:.1f} s after the fault"
              + (" (tritonserver itself aborted)" if server_aborted else ""))
        assert "restarting" in log.read_text()
        if fault == "tts_stream_killed" and not server_aborted:
            assert f"model process: the tts_stream model process (pid {pid}) has died" in log.read_text(), \
                log.read_text()[-3000:]
        assert "shared-memory region(s) the server's model processes left" in log.read_text(), log.read_text()[-3000:]
        regions |= _shm_regions(mark)  # the restarted server's
        # SIGTERM after traffic: everything ends within the exit timeout, nothing is left behind.
        for s in streams:
            s.close()
        streams = []
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20 + 30)
        wait_for(lambda: not _marked(mark), timeout=10, what=f"every process to end: {_marked(mark)}")
        assert proc.returncode == 0, log.read_text()[-3000:]
        assert not [r for r in regions if os.path.exists(f"/dev/shm/{r}")], "shared memory left behind"
    finally:
        for s in streams:
            s.close(cancel=True)
        _kill_marked(mark)
        proc.wait(10)


def test_a_stream_the_decoder_ends_with_an_error_gets_it_and_its_instance_serves_on(tight):
    """The decoder ends a running stream with an error (here the server's stop deadline, written
    by hand; an engine failure does the same): its client gets the error, and the one tts_stream
    instance goes on serving. Python backend 24.10 loses an error response sent after a call's
    first (serving/bls carries it as data): a final one used to leave the orchestrator's event loop
    waiting in the response iterator for ever, and every stream of that instance with it."""
    stop = os.path.join(tight.run_dir, runtime.STOPPING_FILE)
    a = Stream(tight, "A stream the decoder will end.", SEED=1, MIN_LENGTH=3000, MAX_LENGTH=3000)
    try:
        wait_for(lambda: len(a.times) >= 2 or a.done.is_set(), what="the first stream's audio")
        with open(f"{stop}.tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(f"{stop}.tmp", stop)
        assert a.done.wait(30), "the stream never ended"
        assert a.error is not None and str(a.error).endswith("the server is shutting down"), a.error
    finally:
        if os.path.exists(stop):
            os.unlink(stop)
        a.close(cancel=True)
    time.sleep(2 * runtime.STOPPING_READ_S)
    b = Stream(tight, "The next stream, on the same instance.", SEED=2, MIN_LENGTH=3, MAX_LENGTH=3)
    try:
        assert b.done.wait(60), "the instance stopped serving"
        assert b.error is None and sum(len(c) for c in b.chunks) == 3 * P * 1920, b.error
    finally:
        b.close()


def _serve_sh(ckpt, tmp_path, **env_extra):
    """scripts/serve.sh on free loopback ports (no probes, no gateway), its output in serve.log
    -> (its process, the server's URLs with `ready()`, the log's path); not waited for."""
    import types

    from tests.server import _free_ports, triton_env

    http, grpc, metrics_port = _free_ports(3)
    env = triton_env()
    env.update(SKIP_SETUP="1", TRITON_HTTP_PORT=str(http), TRITON_GRPC_PORT=str(grpc),
               TRITON_METRICS_PORT=str(metrics_port), VOXCPM_CHECKPOINT=ckpt, VOXCPM_PROBE_INTERVAL="0",
               OPENAI_API_PORT="0", **env_extra)
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "serve.sh")], env=env, stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def ready():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2).status == 200
        except OSError:
            return False

    srv = types.SimpleNamespace(grpc_url=f"127.0.0.1:{grpc}", http_url=f"127.0.0.1:{http}", ready=ready)
    return proc, srv, log


def test_a_server_whose_supervisor_is_killed_ends_its_requests_and_exits_cleanly(ckpt, tmp_path):
    """The supervisor killed with SIGKILL (it cannot write `stopping`): its tritonserver gets SIGTERM
    (the death signal it set), the models see the supervisor gone and end a long stream at once,
    and the server unloads and exits before its exit timeout. (Before, the stream ran into
    Triton's forced exit, which crashed tritonserver and left it and its processes hung.)"""
    mark = uuid.uuid4().hex
    exit_timeout = 40
    # TMPDIR: the run directory the killed supervisor cannot remove goes here
    proc, srv, log = _serve_sh(ckpt, tmp_path, TRITON_EXIT_TIMEOUT=str(exit_timeout), VOXCPM_TEST_MARK=mark,
                               TMPDIR=str(tmp_path))
    long = None
    try:
        wait_for(lambda: srv.ready() or proc.poll() is not None, timeout=300, what="the server")
        assert proc.poll() is None, log.read_text()
        long = Stream(srv, "Still talking when the supervisor dies.", SEED=3, MIN_LENGTH=4000, MAX_LENGTH=4000)
        wait_for(lambda: len(long.times) >= 2 or long.done.is_set(), timeout=120, what="the stream's first chunks")
        # the supervisor's state directory is held by the server and every model process too: no sweep
        # takes it while any of them runs
        [state] = glob.glob(str(tmp_path / "voxcpm-run-*"))
        held = os.path.join(state, run_state.HELD_FILE)
        server = [(pid, cmd) for pid, cmd in _marked(mark) if "tritonserver" in cmd or "python_backend_stub" in cmd]
        assert len(server) >= 9 and all(held in _open_files(pid) for pid, _ in server), server
        t0 = time.monotonic()
        proc.kill()  # serve.sh exec'd the supervisor: this is it
        proc.wait(10)
        assert long.done.wait(exit_timeout / 2), "the stream did not end"
        assert long.error is not None and str(long.error).endswith("the server is shutting down"), long.error
        long.close()
        long = None
        wait_for(lambda: not _marked(mark), timeout=exit_timeout + 20, what=f"every process to end: {_marked(mark)}")  # the guard too
        stopped = time.monotonic() - t0
        text = log.read_text()
        assert stopped < exit_timeout, f"gone after {stopped:.0f} s: {text[-3000:]}"
        assert "Exit timeout expired" not in text and "Signal (6)" not in text, text[-3000:]
        # the killed supervisor's guard (supervisor/guard.py) removed it, as the next supervisor's sweep would
        assert glob.glob(str(tmp_path / "voxcpm-run-*")) == [], text[-3000:]
        assert (f"guard: the supervisor is gone; killed 0 process(es) its server left; removed {state} and 0 "
                "shared-memory region(s)") in text, text[-3000:]
    finally:
        if long is not None:
            long.close(cancel=True)
        _kill_marked(mark)


def test_sigterm_gives_running_requests_half_the_exit_timeout_and_every_model_unloads(ckpt, tmp_path):
    """scripts/serve.sh stopped (SIGTERM, as `docker stop` sends) while requests run: a stream that
    ends within half the exit timeout ends as usual; a long stream and a long HTTP request end
    then with an error that says the server is shutting down; every model then unloads, nothing
    crashes and nothing is left, before the exit timeout. (Triton 2.51 tells a model nothing until
    its finalize, which waits for its requests: before, a long stream ran until the exit timeout
    cut the server off in the middle of unloading.)"""
    from tests.server import _pids_in_group
    from tests.test_server import tts_http

    # Unloading needs the other half: Triton's HTTP frontend first waits for the HTTP request to
    # end, and python_backend takes about a second per model instance (tts has 8): 11 s here, 4 s
    # short of the default 30's half on a loaded machine, hence more.
    exit_timeout = 40
    proc, srv, log = _serve_sh(ckpt, tmp_path, TRITON_EXIT_TIMEOUT=str(exit_timeout))
    streams = []
    try:
        wait_for(lambda: srv.ready() or proc.poll() is not None, timeout=300, what="the server")
        assert proc.poll() is None, log.read_text()
        long = Stream(srv, "Still talking when the server stops.", SEED=3, MIN_LENGTH=4000, MAX_LENGTH=4000)
        streams.append(long)
        http_result: dict = {}

        def long_http():
            try:
                http_result["audio"] = tts_http(srv, "A whole utterance, still running.", SEED=4, MIN_LENGTH=4000,
                                                MAX_LENGTH=4000)
            except Exception as e:  # noqa: BLE001 - what the test looks at
                http_result["error"], http_result["at"] = e, time.monotonic()

        http_thread = threading.Thread(target=long_http)
        http_thread.start()
        wait_for(lambda: len(long.times) >= 2 or long.done.is_set(), timeout=120, what="the stream's first chunks")
        # Running in the decoder before the SIGTERM (one still on its way there is refused).
        short = Stream(srv, "A short one.", SEED=5, MIN_LENGTH=40, MAX_LENGTH=40)
        streams.append(short)
        wait_for(lambda: short.times or short.done.is_set(), timeout=120, what="the short stream's first chunk")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert short.done.wait(exit_timeout / 2), "the short stream did not finish within its time"
        assert short.error is None and sum(len(c) for c in short.chunks) == 40 * P * 1920, short.error
        assert long.done.wait(exit_timeout + 30), "the long stream never ended"
        ended = time.monotonic() - t0
        assert long.error is not None and str(long.error).endswith("the server is shutting down"), \
            (long.error, log.read_text()[-3000:])
        assert exit_timeout / 2 - 2 < ended < exit_timeout / 2 + 5, ended  # its half of the exit timeout
        http_thread.join(30)
        assert str(http_result.get("error")).endswith("the server is shutting down"), http_result
        assert exit_timeout / 2 - 2 < http_result["at"] - t0 < exit_timeout / 2 + 5, http_result["at"] - t0
        # A client closes its stream once its request has ended: Triton unloads tts_stream only then.
        for s in streams:
            s.close()
        streams = []
        rc = proc.wait(exit_timeout + 30)
        stopped = time.monotonic() - t0
        print(f"SIGTERM: the long requests ended after {ended:.1f} s, the server was gone after {stopped:.1f} s")
        text = log.read_text()
        assert rc == 0, text[-3000:]
        assert "tritonserver stopped" in text and "(exit code 0)" in text, text[-3000:]
        assert stopped < exit_timeout, f"stopped after {stopped:.0f} s: {text[-3000:]}"
        assert "Exit timeout expired" not in text and "Fatal Python error" not in text, text[-3000:]
        for model in ("tts", "tts_stream", "decoder", "vae_decoder", "tokenizer", "text_normalizer"):
            assert f"successfully unloaded '{model}'" in text, model
        wait_for(lambda: _pids_in_group(proc.pid) == [], timeout=10, what="every process of the server to end")
    finally:
        for s in streams:
            s.close(cancel=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
