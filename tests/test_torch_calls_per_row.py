"""The decoder process's per-step host work makes no torch call per request row.

Each torch call that dispatches an op lets go of the GIL, and taking it back waits up to the
interpreter's switch interval (5 ms) whenever another thread of the process is running Python: the
decoder's `execute` taking a burst of requests, the engine's thread, the audio thread
(benchmarks/results.md, sixty-sixth session). `.numpy()`, `.tolist()`, `torch.from_numpy` and
attribute reads keep the GIL; the tests count every other torch call."""

import functools
import types

import pytest
import torch
from torch.overrides import TorchFunctionMode

from voxcpm_triton import VoxCPM2
from voxcpm_triton.engine import Engine, EngineConfig
from voxcpm_triton.engine.engine import _host_rows
from voxcpm_triton.engine.scheduler import Delivery
from voxcpm_triton.audio.stream_audio import StreamAudio
from voxcpm_triton.audio.vae_streams import VAEStreams
from voxcpm_triton.loading import load_audio_vae

KEEPS_THE_GIL = {"numpy", "tolist", "__get__"}


class Calls(TorchFunctionMode):
    """The torch calls made inside it that dispatch an op."""

    def __init__(self):
        super().__init__()
        self.names: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in KEEPS_THE_GIL:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def calls(fn, *args) -> list:
    with Calls() as c:
        fn(*args)
    return c.names


def test_a_collected_steps_rows_cost_no_torch_call():
    for rows in (4, 128):
        patches, stops = torch.randn(rows, 4, 8), torch.rand(rows) > 0.5
        assert calls(_host_rows, patches, stops) == []
        got = _host_rows(patches, stops)
        assert [bool(s) for _, s in got] == stops.tolist() and all(isinstance(s, bool) for _, s in got)
        assert torch.equal(torch.from_numpy(got[-1][0]), patches[-1])


def test_an_audio_rounds_latents_are_put_together_without_a_torch_call_per_request():
    def requests(n):
        return [[torch.randn(1, 2, 8), torch.randn(2, 2, 8)] if i % 2 else [torch.randn(4, 2, 8)]
                for i in range(n)]

    for n in (2, 30):  # one torch.cat of every chunk, whatever the requests (and numpy copies as few)
        reqs = requests(n)
        assert calls(StreamAudio._batch_frames, reqs, 10) == ["cat"]
        z = StreamAudio._batch_frames(reqs, 10)
        for row, chunks in zip(z, reqs):  # [D, frames]: the patches' frames, then silence
            frames = torch.cat(chunks).reshape(-1, 8).T
            assert torch.equal(row[:, :frames.shape[1]], frames) and not row[:, frames.shape[1]:].any()


def test_a_closed_vae_stream_is_zeroed_in_one_call(checkpoint_dirs):
    _, vae = load_audio_vae(checkpoint_dirs["real_shaped"], torch.device("cpu"))
    streams = VAEStreams(vae, 2, max_streams=4)
    assert len(streams.pools) > 1
    for p in streams.pools:
        p.fill_(1.0)
    assert len(calls(streams._zero, 3)) == 1
    assert all(not p[3].any() and p[2].all() for p in streams.pools)


@pytest.fixture(scope="module")
def engine(checkpoint_dirs):
    vox = VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cpu", dtype="float32")
    eng = Engine(vox, EngineConfig(num_blocks=256, block_size=4, max_num_seqs=32))
    yield eng
    eng.shutdown()


def test_a_steps_inputs_cost_the_same_torch_calls_for_any_number_of_rows(engine):
    runner = engine.runner

    def fill(n):
        rows = [(i, 7 * i, 0, 3, 4 * i, 4, [i, i + 1], 2.0, 10) for i in range(n)]
        h = runner._take_host_buffers()
        try:
            return calls(runner._fill, h, rows, runner.bucket(n), 10), h.blocks[:n, :2].tolist()
        finally:
            runner._host_free.append(h)

    fill(1)  # (its first call builds the timestep tables it keeps)
    few, blocks_few = fill(2)
    many, blocks_many = fill(32)
    assert len(few) == len(many), (few, many)
    assert blocks_many == [[i, i + 1] for i in range(32)] and blocks_few == [[0, 1], [1, 2]]


def test_handing_out_a_step_costs_the_same_torch_calls_for_any_number_of_rows():
    """`Engine._deliver` and `_emit` as the engine runs them, on a stand-in engine whose every request
    sends a chunk at each second patch."""
    from voxcpm_triton.engine.engine import Engine

    class Scheduler:
        def is_running(self, st):
            return True

        def on_patch(self, st, patch, stop, now):
            st.pending.append(patch)
            if len(st.pending) < 2:
                return Delivery(None, 0, None)
            out, st.pending = st.pending, []
            return Delivery(out, 0, None)

    def deliver(n):
        patches = [torch.randn(n, 4, 8) for _ in range(2)]
        states = [types.SimpleNamespace(request_id=f"r{i}", pending=[], sent=[]) for i in range(n)]
        for st in states:
            st.sink = st.sent.append
        engine = types.SimpleNamespace(scheduler=Scheduler(), runner=types.SimpleNamespace())
        engine._send = functools.partial(Engine._send, engine)
        engine._emit = functools.partial(Engine._emit, engine)
        got = []
        stops = torch.zeros(n, dtype=torch.bool)
        for step in patches:
            engine.runner.collect = lambda _step, p=step: (p, stops)
            got += calls(Engine._deliver, engine, [(states, None)])
        for i, st in enumerate(states):  # each request's chunk: its two patches, in order
            assert len(st.sent) == 1 and torch.equal(st.sent[0].patches, torch.stack([p[i] for p in patches]))
        return got

    assert len(deliver(4)) == len(deliver(32)) == 0
