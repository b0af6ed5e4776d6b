"""Two CPU instances (KIND_CPU, count 2) of decoder and vae_decoder, as a multi-GPU machine runs
one per GPU: Triton spreads the orchestrators' requests over both engines, each of which makes
its own requests' audio (decode_audio), each instance logs its device and labels its metrics, and
every result equals the same request run alone. A client's hang-up stops its request on whichever engine holds it, and
a LoRA adapter added or removed through `loras` is added or removed on both engines."""

import os
import re
import shutil
import threading
import time

import numpy as np
import pytest

from tests.conftest import require_module

require_module("tritonclient", "tritonclient[all] in requirements.txt")
from tests.lora_helpers import write_adapters  # noqa: E402
from tests.server import edited_repository, triton_server_factory  # noqa: E402,F401
from tests.test_lora_served import loras  # noqa: E402
from tests.test_resilience import Stream  # noqa: E402
from tests.test_server import TOL, metric_samples, tts_http, tts_stream  # noqa: E402
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint  # noqa: E402

INSTANCES = {"decoder": 2, "vae_decoder": 2}


P = TINY_CONFIG["patch_size"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("mi_ckpt")), TINY_CONFIG, seed=3, progress=None)


@pytest.fixture(scope="module")
def lora_dir(ckpt, tmp_path_factory):
    """No adapter at start; `.spare` holds one for the tests to add."""
    d = str(tmp_path_factory.mktemp("mi_loras"))
    write_adapters(ckpt, os.path.join(d, ".spare"), names=("lm_dit",), seed=1)
    return d


@pytest.fixture(scope="module")
def server(triton_server_factory, tmp_path_factory, ckpt, lora_dir):  # noqa: F811
    repo = edited_repository(tmp_path_factory.mktemp("mi") / "model_repository", instances=INSTANCES)
    for model in INSTANCES:
        cfg = repo / model / "config.pbtxt"
        text = cfg.read_text()
        assert "kind: KIND_AUTO" in text, model
        cfg.write_text(text.replace("kind: KIND_AUTO", "kind: KIND_CPU"))
    return triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt, "VOXCPM_LORA_DIR": lora_dir})


@pytest.fixture
def gpus(monkeypatch):
    """Pretend `n` GPUs are visible; records the devices set current."""
    import torch

    current = []

    def visible(n):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", current.append)
        return current

    return visible


def test_instances_spread_over_the_visible_gpus(gpus):
    from voxcpm_triton.serving.placement import instance_device

    current = gpus(4)
    cpu_kind = [{"model_instance_name": f"decoder_0_{k}", "model_instance_kind": "CPU"} for k in range(6)]
    assert [str(instance_device(a, None)) for a in cpu_kind] == [f"cuda:{k % 4}" for k in range(6)]
    assert [str(instance_device(a, "cuda")) for a in cpu_kind[:2]] == ["cuda:0", "cuda:1"]
    assert [str(d) for d in current] == [f"cuda:{k % 4}" for k in range(6)] + ["cuda:0", "cuda:1"]
    gpu_kind = {"model_instance_name": "decoder_0_0", "model_instance_kind": "GPU", "model_instance_device_id": "3"}
    assert str(instance_device(gpu_kind, None)) == "cuda:3"
    # A device the configuration names is every instance's; "cpu" stays on the CPU.
    assert str(instance_device(gpu_kind, "cuda:2")) == str(instance_device(cpu_kind[1], "cuda:2")) == "cuda:2"
    assert str(instance_device(cpu_kind[3], "cpu")) == "cpu"
    with pytest.raises(ValueError, match="'cuda:7'.*only 4 GPU"):
        instance_device(cpu_kind[0], "cuda:7")


def test_without_a_gpu_every_instance_runs_on_the_cpu(gpus):
    from voxcpm_triton.serving.placement import instance_device

    current = gpus(0)
    assert str(instance_device({"model_instance_name": "vae_decoder_0_1"}, None)) == "cpu"
    with pytest.raises(ValueError, match="CUDA is not available"):
        instance_device({"model_instance_name": "vae_decoder_0_1"}, "cuda")
    assert current == []


def per_instance(server, name: str) -> dict[str, float]:
    """instance label -> value of metric `name`."""
    return {labels["instance"]: v for n, labels, v in metric_samples(server) if n == name}


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()


def test_each_instance_logs_its_device_and_labels_its_metrics(server):
    for model, n in INSTANCES.items():
        for k in range(n):
            assert re.search(rf"{model} instance {model}_0_{k} (ready|loaded).*device=(cpu|cuda:\d)", server.log), (model, k)
    assert set(per_instance(server, "voxcpm_kv_blocks_total")) == {"decoder_0_0", "decoder_0_1"}
    assert set(per_instance(server, "voxcpm_vae_streams")) == {"vae_decoder_0_0", "vae_decoder_0_1"}


def test_concurrent_requests_spread_over_both_instances_and_equal_their_solo_runs(server):
    texts = ["First voice.", "Second one, a bit longer.", "三号。", "Fourth!", "Fifth stream here.", "Six."]
    jobs = [dict(text=t, SEED=200 + i, MIN_LENGTH=4 + i, MAX_LENGTH=4 + 2 * i) for i, t in enumerate(texts)]

    def run(job, kind):
        params = {k: v for k, v in job.items() if k != "text"}
        if kind == "http":
            return tts_http(server, job["text"], **params)[0]
        return np.concatenate(tts_stream(server, job["text"], **params))

    def total(name):
        return sum(per_instance(server, name).values())

    kinds = ["stream" if i % 2 == 0 else "http" for i in range(len(jobs))]
    finished_0 = total("voxcpm_engine_requests_finished_total")
    solo = [run(j, k) for j, k in zip(jobs, kinds)]
    # tts may run a seeded bad case again: count the decoder requests the solo runs made.
    assert wait_for(lambda: total("voxcpm_engine_requests_finished_total") - finished_0 >= len(jobs))
    time.sleep(1.0)  # a few metric periods: a last retry's end is published too
    finished_before = per_instance(server, "voxcpm_engine_requests_finished_total")
    expected = sum(finished_before.values()) - finished_0

    results = [None] * len(jobs)

    def worker(i):
        results[i] = run(jobs[i], kinds[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, (got, want) in enumerate(zip(results, solo)):
        assert got is not None and got.shape == want.shape, i
        assert np.abs(got - want).max() <= TOL, i

    # The metrics thread publishes a few times a second: wait for all the concurrent ends.
    def finished():
        now = per_instance(server, "voxcpm_engine_requests_finished_total")
        return {k: now[k] - finished_before.get(k, 0) for k in now}

    assert wait_for(lambda: sum(finished().values()) == expected), (finished(), expected)
    print("decoder requests per instance:", finished())
    assert all(v >= 1 for v in finished().values()) and len(finished()) == 2, finished()
    # Each engine made its requests' audio and dropped their state; vae_decoder was never needed.
    assert set(per_instance(server, "voxcpm_decoder_audio_streams")) == {"decoder_0_0", "decoder_0_1"}
    assert wait_for(lambda: set(per_instance(server, "voxcpm_decoder_audio_streams").values()) == {0.0})
    assert set(per_instance(server, "voxcpm_vae_streams_started_total").values()) == {0.0}
    assert wait_for(lambda: set(per_instance(server, "voxcpm_engine_running_requests").values()) == {0.0})


def test_instance_count_reads_the_normalized_instance_group(gpus):
    import json

    from voxcpm_triton.serving import triton_io
    from voxcpm_triton.serving.placement import instance_count

    def args(*groups):
        return {"model_config": json.dumps({"instance_group": list(groups)})}

    gpus(4)
    assert instance_count(args({"count": 1, "kind": "KIND_GPU", "gpus": [0, 1, 2]})) == 3
    assert instance_count(args({"count": 2, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_GPU", "gpus": [3]})) == 3
    assert instance_count(args({"count": 1, "kind": "KIND_AUTO"})) == 4
    gpus(0)
    assert instance_count(args({"count": 1, "kind": "KIND_AUTO"})) == 1
    assert instance_count({"model_config": "{}"}) == 1
    # the orchestrators' count (no torch there): tts gates half its instances for text_normalizer
    assert triton_io.instance_count(args({"count": 4, "kind": "KIND_GPU", "gpus": [0, 1]})) == 8
    assert triton_io.instance_count(args({"count": 8, "kind": "KIND_CPU"})) == 8


def test_a_client_hang_up_stops_its_request_on_whichever_instance_holds_it(server):
    """The orchestrator's cancel reaches one decoder instance; the instance holding the request
    stops it all the same, within a poll of the other's."""
    n = 4
    streams = [Stream(server, f"Stream number {i}, long enough to run for minutes.", SEED=300 + i,
                      MIN_LENGTH=3000, MAX_LENGTH=3000, INFERENCE_TIMESTEPS=4) for i in range(n)]
    try:
        # A second of chunks each: the first few come in a burst, and a rate from them alone is far too high.
        assert wait_for(lambda: all(len(s.times) >= 2 and s.times[-1] - s.times[0] >= 1.0 or s.done.is_set()
                                    for s in streams), 60)
        assert not any(s.error for s in streams), [s.error for s in streams]
        assert wait_for(lambda: sum(per_instance(server, "voxcpm_engine_running_requests").values()) == n)
        running = per_instance(server, "voxcpm_engine_running_requests")
        assert len(running) == 2 and min(running.values()) >= 1, running  # both instances hold some
        # Patches per second of one stream: what the rest of its 3000 patches would take.
        s = streams[0]
        rate = sum(c.size for c in s.chunks[1:]) / (P * 1920) / (s.times[-1] - s.times[0])
    finally:
        for s in streams:
            s.close(cancel=True)
    t0 = time.monotonic()
    assert wait_for(lambda: set(per_instance(server, "voxcpm_engine_running_requests").values()) == {0.0}, 10), \
        per_instance(server, "voxcpm_engine_running_requests")
    stopped_s = time.monotonic() - t0
    print(f"all {n} stopped {stopped_s:.1f} s after the hang-up; alone they had ~{3000 / rate:.0f} s to go")
    assert stopped_s < 0.1 * 3000 / rate, (stopped_s, rate)
    assert wait_for(lambda: set(per_instance(server, "voxcpm_kv_blocks_free").values())
                    == set(per_instance(server, "voxcpm_kv_blocks_total").values()))


def test_a_lora_adapter_added_or_removed_through_loras_reaches_both_instances(server, lora_dir):
    shutil.copytree(os.path.join(lora_dir, ".spare", "lm_dit"), os.path.join(lora_dir, "late"))
    lora = ("BYTES", np.array([b"late"], dtype=object))
    gen = dict(SEED=11, MIN_LENGTH=3, MAX_LENGTH=3, INFERENCE_TIMESTEPS=4, RETRY_BADCASE=("BOOL", np.array([False])))
    try:
        assert loras(server, "list") == []
        assert loras(server, "add", "late") == ["late"]
        before = per_instance(server, "voxcpm_engine_requests_finished_total")
        results, errors = [], []

        def one():
            try:
                results.append(tts_http(server, "An adapter on either engine.", LORA=lora, **gen)[0])
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(results) == 6, errors
        assert all(np.abs(r - results[0]).max() <= TOL for r in results)

        def served():
            now = per_instance(server, "voxcpm_engine_requests_finished_total")
            return {k: now[k] - before.get(k, 0) for k in now}

        assert wait_for(lambda: sum(served().values()) == 6)
        assert len(served()) == 2 and min(served().values()) >= 1, served()  # both engines ran it
        for _ in range(4):  # whichever instance answers
            assert loras(server, "list") == ["late"]
        assert loras(server, "remove", "late") == []
        for _ in range(4):
            with pytest.raises(Exception, match="late"):
                tts_http(server, "Gone from both engines.", LORA=lora, **gen)
            assert loras(server, "list") == []
    finally:
        shutil.rmtree(os.path.join(lora_dir, "late"), ignore_errors=True)
