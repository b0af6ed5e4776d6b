"""serving/bls: decoupled BLS responses read only as far as the callee has counted, so no thread
waits inside Triton's response iterator (where Triton 2.51's Python backend can deadlock); and the
toy models of benchmarks/bls_stress under load on a real tritonserver."""

from __future__ import annotations

import asyncio
import collections
import errno
import glob
import logging
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from voxcpm_triton.serving.bls import audio_channel, callee, caller, protocol

REPO = Path(__file__).resolve().parents[1]
FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Response:
    def __init__(self, value, final=False, error=False):
        self.value, self.final, self.error = value, final, error

    def has_error(self):
        return self.error


class Payload(str):
    """What a fake callee sends: a string, no error."""

    def has_error(self):
        return False


class Failure(str):
    """An error response a fake callee sends."""

    def has_error(self):
        return True


class BufferedIterator:
    """A response iterator whose `next` must never wait: it fails if its buffer is empty. Like
    Triton's, it keeps its responses, and `iter()` on a finished one starts it over."""

    def __init__(self, first):
        self.buffer = collections.deque([first])
        self.history: list = []
        self.finished, self.idx = False, 0

    def __iter__(self):
        if self.finished and self.idx >= len(self.history):
            self.idx = 0
        return self

    def __next__(self):
        if self.finished:
            if self.idx < len(self.history):
                self.idx += 1
                return self.history[self.idx - 1]
            raise StopIteration
        if not self.buffer:
            raise AssertionError("next() called with nothing buffered: it would wait")
        r = self.buffer.popleft()
        self.history.append(r)
        if r.final:
            self.finished, self.idx = True, len(self.history)
        return r


class WaitingIterator(BufferedIterator):
    """One whose `next` waits for a response, as Triton's does."""

    def __init__(self, first):
        super().__init__(first)
        self.cond = threading.Condition()

    def deliver(self, r):
        with self.cond:
            self.buffer.append(r)
            self.cond.notify_all()

    def __next__(self):
        with self.cond:
            self.cond.wait_for(lambda: self.buffer or self.finished)
            return super().__next__()


class Sender:
    """A callee's response sender: what it sends is buffered in the caller's iterator before `send`
    returns (as the server does). The first response is the one the call returns with."""

    def __init__(self, iterator):
        self.iterator, self.sent = iterator, 0

    def send(self, response=None, flags=0):
        if self.sent:
            self.iterator.buffer.append(Response(response, bool(flags & FINAL), isinstance(response, Failure)))
        self.sent += 1

    def is_cancelled(self):
        return False


class Request:
    def __init__(self, parameters: str, outputs=(protocol.ERROR_OUTPUT,)):
        self._parameters, self._outputs = parameters, list(outputs)

    def parameters(self):
        return self._parameters

    def requested_output_names(self):
        return self._outputs


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXCPM_RUN_DIR", str(tmp_path))
    # An error carried as data (ERROR_OUTPUT), in this file's fakes: "ERROR:<message>".
    monkeypatch.setattr(protocol, "carried", lambda response: Payload(
        "ERROR:" + (response.value if isinstance(response, Response) else response)))
    monkeypatch.setattr(protocol, "error_output", lambda r: r.value[6:] if not r.error and isinstance(
        r.value, str) and r.value.startswith("ERROR:") else None)
    monkeypatch.setattr(protocol, "error_response", lambda message: Response(message, error=True))
    yield tmp_path
    caller.close()


def _call(iterator, delay: float = 0.0):
    """Start a simulated call returning `iterator` after `delay` -> (stream, its parameters)."""
    params = {}

    async def returns():
        await asyncio.sleep(delay)
        return iterator

    def make_call(p):
        params.update(p)
        return returns()

    return caller.call(make_call), params


def _counting(params: dict, iterator, channel: bool = False) -> callee.CountingSender:
    import json

    sender = callee.counting_sender(Request(json.dumps(params)), Sender(iterator), FINAL, channel=channel)
    assert isinstance(sender, callee.CountingSender)
    send = sender.send
    sender.send = lambda response=None, flags=0: send(
        Payload(response) if type(response) is str else response, flags)
    return sender


async def _started_call(first: str = "r1", channel: bool = False):
    """A counted call that has returned with its first response, `first` (with the caller's audio
    channel taken if `channel`) -> (iterator, stream, sender)."""
    it = BufferedIterator(Response(first))
    stream, params = _call(it)
    sender = _counting(params, it, channel=channel)
    sender.send(first)
    await stream.started.wait()
    return it, stream, sender


async def _drain(stream, timeout=10.0):
    out = []
    while (r := await asyncio.wait_for(stream.queue.get(), timeout)) is not stream.END:
        out.append(r)
    return out


def test_responses_are_read_as_far_as_counted_and_next_never_waits(run_dir):
    async def main():
        it = BufferedIterator(Response("r1"))
        stream, params = _call(it, delay=0.05)
        assert set(params) == {protocol.PARAMETER, audio_channel.PARAMETER}
        sender = _counting(params, it)
        sender.send("r1")  # counted before the call has returned: the count waits for the iterator
        await stream.started.wait()
        sender.send("r2")
        sender.send("r3")
        await asyncio.sleep(0.05)
        sender.send(flags=FINAL)  # the final flag alone, as the decoder sends it
        got = await _drain(stream)
        assert [r.value for r in got] == ["r1", "r2", "r3", None] and got[-1].final
        assert stream.returned and not stream.threaded
        assert stream.token not in caller._inbox[1].streams, "a finished call is forgotten"
        assert any(g is it for _, g in caller._graves), "its iterator is kept a while (see _bury)"

    asyncio.run(main())


def test_many_calls_interleaved_get_each_its_own_responses(run_dir):
    async def main():
        calls = []
        for i in range(20):
            it = BufferedIterator(Response(f"{i}-0"))
            stream, params = _call(it)
            sender = _counting(params, it)
            sender.send(f"{i}-0")
            calls.append((stream, sender))
        for k in range(1, 4):
            for i, (_, sender) in enumerate(calls):
                sender.send(f"{i}-{k}", flags=FINAL if k == 3 else 0)
        for i, (stream, _) in enumerate(calls):
            assert [r.value for r in await _drain(stream)] == [f"{i}-{k}" for k in range(4)]
        assert not caller._inbox[1].streams

    asyncio.run(main())


def test_the_servers_own_error_ends_the_call_and_nothing_waits(run_dir):
    """The server's own error response (a refused request: the call's only one, never counted)
    ends the call after ERROR_GRACE_S, read once, by a thread that finds the iterator finished."""
    async def main():
        t0 = time.monotonic()
        stream, _ = _call(WaitingIterator(Response("model 'decoder' is busy", final=True, error=True)))
        got = await _drain(stream)
        assert [r.value for r in got] == ["model 'decoder' is busy"]
        assert not stream.waited and time.monotonic() - t0 < caller.GRACE_S

    asyncio.run(main())


def test_a_counted_error_that_is_not_final_does_not_end_the_call(run_dir):
    """The server's error on a counted response (no memory for an output): the counts go on, and
    so does the call, to its final response."""
    async def main():
        it, stream, sender = await _started_call()
        sender.send("r2")
        it.buffer[-1].error = True  # what the server made of it
        sender.send("r3")
        sender.send(flags=FINAL)
        got = await _drain(stream)
        assert [(r.value, r.error) for r in got] == [("r1", False), ("r2", True), ("r3", False), (None, False)]
        assert not stream.threaded

    asyncio.run(main())


def test_an_error_after_the_first_response_travels_as_data_and_is_read_as_an_error(run_dir):
    """The stub loses the call of an error response that comes through the server's callback
    (every response after the first), and a final one would leave next() waiting for ever: the
    callee sends such an error as data, the caller reads it back as an error response. The
    first response's error (the call's return value) is sent as it is."""
    async def main():
        it, stream, sender = await _started_call()
        sender.send("r2")
        sender.send(Failure("[busy] the server is shutting down"), flags=FINAL)
        assert [(r.value, r.error, r.final) for r in it.buffer] == [
            ("r2", False, False), ("ERROR:[busy] the server is shutting down", False, True)]
        got = await _drain(stream)
        assert [(r.value, r.error) for r in got] == [
            ("r1", False), ("r2", False), ("[busy] the server is shutting down", True)]
        assert not stream.threaded

    asyncio.run(main())
    sent = []
    first = callee.CountingSender(types.SimpleNamespace(send=lambda r=None, flags=0: sent.append(r)),
                                      str(run_dir / "nobody.sock"), "0" * 16, FINAL)
    first.send(Failure("refused"), flags=FINAL)  # a call's first response is its return value: as it is
    assert sent == ["refused"] and isinstance(sent[0], Failure)
    sent.clear()  # a call nobody counts (its caller reads it with a waiting thread) carries them the same way
    carrying = callee.CarryingSender(types.SimpleNamespace(send=lambda r=None, flags=0: sent.append(r)))
    carrying.send(Payload("r1"))
    carrying.send(Failure("[busy] the server is shutting down"), flags=FINAL)
    assert sent == ["r1", "ERROR:[busy] the server is shutting down"] and not isinstance(sent[1], Failure)


def test_a_call_nobody_counts_is_read_by_a_waiting_thread_once(run_dir, monkeypatch, caplog):
    """A callee that does not count: after GRACE_S a thread reads the rest, and a response read
    before is not read again (iterating a finished Triton iterator starts it over)."""
    monkeypatch.setattr(caller, "GRACE_S", 0.2)

    async def main():
        it = WaitingIterator(Response("first"))
        stream, _ = _call(it)  # its parameter is not passed on: nothing will count
        assert (await asyncio.wait_for(stream.queue.get(), 5)).value == "first"
        it.deliver(Response("late", final=True))
        assert [r.value for r in await _drain(stream)] == ["late"]
        assert stream.threaded and stream.waited and stream.done  # (nothing left for a cancel to stop)
        only = WaitingIterator(Response("only", final=True))  # finished before the thread takes over
        stream, _ = _call(only)
        assert [r.value for r in await _drain(stream)] == ["only"]

    asyncio.run(main())
    assert "no response count" in caplog.text


def test_counts_that_stop_on_an_open_call_hand_it_to_a_waiting_thread(run_dir, monkeypatch, caplog):
    monkeypatch.setattr(caller, "FALLBACK_S", 0.5)

    async def main():
        it = WaitingIterator(Response("r1"))
        stream, params = _call(it)
        _counting(params, it).send("r1")
        assert (await asyncio.wait_for(stream.queue.get(), 5)).value == "r1"
        await asyncio.sleep(1.0)  # no count: the thread takes over and waits in the iterator
        assert stream.threaded
        it.deliver(Response("uncounted", final=True))
        assert [r.value for r in await _drain(stream)] == ["uncounted"]

    asyncio.run(main())
    assert "no response count" in caplog.text


def _kinds(got: list) -> list:
    """A drained stream's items: responses by value, channel chunks as (patches, first sample), ends."""
    return [("chunk", r.patches, float(r.audio[0])) if isinstance(r, audio_channel.Chunk)
            else ("ended", r.error) if isinstance(r, audio_channel.Ended) else r.value for r in got]


def test_a_calls_audio_comes_over_the_channel_before_its_end(run_dir):
    """With the caller's audio channel: the call's first response (empty), its chunks and its end as
    frames, then its final response, sent by the channel's thread after the end frame."""
    async def main():
        it = BufferedIterator(Response("admitted"))
        stream, params = _call(it)
        sender = _counting(params, it, channel=True)
        assert sender.channel is not None and sender.channel.path == params[audio_channel.PARAMETER]
        sender.send("admitted")
        await stream.started.wait()
        long = np.arange(40_000, dtype=np.float32)  # past a socket buffer: the frame arrives in pieces
        sender.chunk(1, np.full(7, 1.5, np.float32))
        sender.chunk(4, long)
        sender.end(None)
        got = await _drain(stream)
        assert _kinds(got) == ["admitted", ("chunk", 1, 1.5), ("chunk", 4, 0.0), ("ended", None), None]
        assert np.array_equal(got[2].audio, long) and got[-1].final
        assert not stream.threaded and stream.token not in caller._inbox[1].streams

    asyncio.run(main())


def test_a_calls_frames_are_read_before_the_count_of_its_final_response(run_dir):
    """The count of a call's final response can be read before the frames written ahead of it (two
    sockets): the inbox reads its channel first, so the call's end never overtakes its audio."""
    async def main():
        _, stream, sender = await _started_call("admitted", channel=True)
        sender.chunk(2, np.ones(5, np.float32))
        sender.end("the engine failed")
        assert sender.channel.drain(time.monotonic() + 5)  # frames written, final response sent and counted
        time.sleep(0.1)  # (the count is a datagram: in the socket by now)
        caller._inbox[1].read()  # the counts' reader, before the loop has looked at the channel
        got = []
        while not stream.queue.empty():
            got.append(stream.queue.get_nowait())
        assert got[-1] is stream.END
        # the final response carries the error too (restored from the data it travelled as)
        assert _kinds(got[:-1]) == ["admitted", ("chunk", 2, 1.0), ("ended", "the engine failed"),
                                    "the engine failed"] and got[-2].has_error()

    asyncio.run(main())


def test_frames_keep_an_open_call_from_the_waiting_thread(run_dir, monkeypatch):
    """A call whose audio comes over the channel sends no response for a long while: its frames
    count as progress, so it is not handed to a waiting thread."""
    monkeypatch.setattr(caller, "FALLBACK_S", 0.3)

    async def main():
        _, stream, sender = await _started_call("admitted", channel=True)
        for _ in range(10):
            sender.chunk(1, np.zeros(3, np.float32))
            await asyncio.sleep(0.1)
        sender.end(None)
        got = await _drain(stream)
        assert not stream.threaded and _kinds(got).count(("chunk", 1, 0.0)) == 10

    asyncio.run(main())


def test_a_broken_channel_drops_its_frames_and_ends_its_calls_with_the_loss(tmp_path, caplog):
    """A caller whose process is gone (no socket): its frames are dropped, and each call's end is told
    its audio was lost, in order. The broken writer leaves the registry (the caller's next calls get
    a new one) and its thread ends; what its calls queue after that is done where it is queued."""
    run_dir = str(tmp_path.resolve())
    path = str(tmp_path / "chan-1-0123abcd.sock")
    w = audio_channel.writer(path, run_dir)
    done = []
    w.chunk("0123456789abcdef", 1, np.zeros(3, np.float32))
    w.end("0123456789abcdef", None, lambda lost: done.append(("first", lost)))
    w.end("fedcba9876543210", "failed", lambda lost: done.append(("second", lost)))
    assert w.drain(time.monotonic() + 5)
    assert w.broken and w.written == 0 and done == [("first", True), ("second", True)] and "broken" in caplog.text
    deadline = time.monotonic() + 5
    while not w.exited:
        assert time.monotonic() < deadline, "the broken writer's thread did not end"
        time.sleep(0.01)
    assert audio_channel.writer(path, run_dir) is not w, "a new call gets a new writer"
    w.end("0011223344556677", None, lambda lost: done.append(("late", lost, threading.current_thread().name)))
    assert done[-1] == ("late", True, threading.current_thread().name)


def test_an_idle_writer_whose_caller_closed_its_channel_ends(tmp_path, monkeypatch, caplog):
    """The caller's process or model goes while no call of it runs: its writer sees the channel
    closed, leaves the registry, and its thread and socket end (else one of each per caller gone)."""
    monkeypatch.setattr(audio_channel, "IDLE_CHECK_S", 0.05)
    caplog.set_level(logging.INFO, logger=audio_channel.log.name)

    async def main():
        got = []
        listener = audio_channel.Listener(asyncio.get_running_loop(), str(tmp_path / "chan-5-0123abcd.sock"),
                                          lambda token, item: got.append(item))
        w = audio_channel.writer(listener.path, str(tmp_path.resolve()))
        w.end("0123456789abcdef", None, lambda lost: got.append(lost))
        assert w.drain(time.monotonic() + 5)
        await asyncio.sleep(0.3)  # idle, its caller there: it stays
        listener.read_all()
        assert not w.broken and not w.exited and w.written == 1
        assert got[0] is False and isinstance(got[1], audio_channel.Ended)  # its end, not lost; its frame read
        listener.close()
        return w

    w = asyncio.run(main())
    deadline = time.monotonic() + 5
    while not w.exited or w in audio_channel._running:
        assert time.monotonic() < deadline, "the writer of a closed channel did not end"
        time.sleep(0.01)
    assert w.broken and w.sock.fileno() == -1 and "caller closed it" in caplog.text
    assert audio_channel.writer(w.path, str(tmp_path.resolve())) is not w


def test_no_response_goes_to_a_call_whose_callers_process_has_died(tmp_path, caplog, monkeypatch):
    """Sent through the server to a stub that is gone, a response waits for good, holding the thread
    that sends it (the decoder's execute, its audio thread or a channel's writer: IPC_LOCK with it, so
    every other stream). So nothing is sent to a caller whose process has died (the pid in its
    inbox's name), and the call reads as cancelled, so the engine stops it. A channel whose caller
    merely closed it still gets its final responses (the test above)."""
    import signal
    import subprocess

    monkeypatch.setattr(protocol, "error_response", lambda message: message)  # (no Triton here)
    path = str(tmp_path / "chan-7-0123abcd.sock")
    caller = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "c, _ = s.accept(); print('connected', flush=True); time.sleep(60)"), path], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            assert time.monotonic() < deadline and caller.poll() is None, "the caller did not listen"
            time.sleep(0.01)
        w = audio_channel.writer(path, str(tmp_path.resolve()))
        sent = []
        triton_sender = types.SimpleNamespace(send=lambda *a, **k: sent.append(k), is_cancelled=lambda: False)
        sender = callee.CountingSender(triton_sender, str(tmp_path / f"bls-{caller.pid}-0123abcd.sock"),
                                           "0123456789abcdef", 1, types.SimpleNamespace(sent=lambda *a: None), w)
        sender.send()  # the call's admission
        sender.chunk(1, np.zeros(3, np.float32))
        assert caller.stdout.readline().strip() == "connected"
        assert w.drain(time.monotonic() + 5) and sent == [{"flags": 0}] and not sender.is_cancelled()
        caller.send_signal(signal.SIGKILL)
        caller.wait(10)
        assert sender.is_cancelled()
        sender.chunk(1, np.zeros(3, np.float32))
        sender.end(None)
        assert w.drain(time.monotonic() + 5)
        sender.send("refused", flags=1)
        assert w.broken and sent == [{"flags": 0}]
        assert caplog.text.count(f"its caller's process (pid {caller.pid}) has died") == 1
    finally:
        caller.kill()
        caller.wait(10)


def test_the_final_response_of_a_call_whose_frames_were_dropped_says_so(run_dir):
    async def main():
        _, stream, sender = await _started_call("admitted", channel=True)
        caller._inbox[1].channel.close()  # the caller's channel goes: the decoder's writes fail
        sender.chunk(1, np.ones(3, np.float32))
        sender.end(None)
        got = await _drain(stream)
        assert _kinds(got) == ["admitted", audio_channel.LOST] and got[-1].has_error()

    asyncio.run(main())


def test_a_channel_that_takes_nothing_breaks_past_its_queue_bound(tmp_path, monkeypatch):
    """A caller that reads nothing: once MAX_QUEUED_BYTES are queued for it the writer breaks and
    drops the rest, so the decoder's memory does not grow with it."""
    monkeypatch.setattr(audio_channel, "MAX_QUEUED_BYTES", 1 << 20)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, never reads
    listener.bind(str(tmp_path / "chan-2-0123abcd.sock"))
    listener.listen(1)
    w = audio_channel.Writer(str(tmp_path / "chan-2-0123abcd.sock"))
    ended = []
    for _ in range(40):
        w.chunk("0123456789abcdef", 1, np.zeros(16_384, np.float32))  # 64 KiB each
    w.end("0123456789abcdef", None, ended.append)
    assert w.broken and w.queued_bytes <= 1 << 20  # the rest dropped, not queued
    listener.close()  # the writer, blocked in its send, fails now
    assert w.drain(time.monotonic() + 10) and ended == [True]


def test_the_callee_takes_only_a_channel_of_this_server_when_asked(run_dir):
    import json

    inbox = str(run_dir / "bls-12-0123abcd.sock")
    base = {protocol.PARAMETER: f"{inbox} 0123456789abcdef"}
    good = str(run_dir / "chan-12-0123abcd.sock")
    for value in (str(run_dir / "other.sock"), "/tmp/chan-12-0123abcd.sock", f"{run_dir}/../chan-12-0123abcd.sock",
                  7, None):
        request = Request(json.dumps({**base, audio_channel.PARAMETER: value}))
        sender = callee.counting_sender(request, Sender(None), FINAL, channel=True)
        assert isinstance(sender, callee.CountingSender) and sender.channel is None, value
    other = str(run_dir / "chan-13-0123abcd.sock")  # another process's channel than the counts' inbox
    assert callee.counting_sender(Request(json.dumps({**base, audio_channel.PARAMETER: other})), Sender(None),
                                      FINAL, channel=True).channel is None
    request = Request(json.dumps({**base, audio_channel.PARAMETER: good}))
    assert callee.counting_sender(request, Sender(None), FINAL, channel=False).channel is None
    sender = callee.counting_sender(request, Sender(None), FINAL, channel=True)
    assert sender.channel is audio_channel.writer(good, str(run_dir.resolve())) and sender.channel.path == good


def test_a_queued_chunk_is_a_copy_not_a_view_of_the_decoded_batch(tmp_path):
    """A chunk waits in the writer's queue as bytes of its own: the decoded batch's (pinned) buffer it
    came from is reused or freed meanwhile, and a slow caller must not keep whole batches alive."""
    async def main():
        got = []
        listener = audio_channel.Listener(asyncio.get_running_loop(), str(tmp_path / "chan-3-0123abcd.sock"),
                                          lambda token, item: got.append(item))
        w = audio_channel.Writer(listener.path)
        hold = threading.Event()
        w.end("0123456789abcdef", None, lambda lost: hold.wait(5))  # the writer's thread held up
        batch = np.full((2, 6), 7.0, np.float32)
        w.chunk("fedcba9876543210", 1, batch[1, :3])
        batch[:] = -1.0  # the buffer reused before the chunk is written
        hold.set()
        assert w.drain(time.monotonic() + 5)
        await asyncio.sleep(0.05)
        listener.read_all()
        listener.close()
        return got

    got = asyncio.run(main())
    assert [type(g).__name__ for g in got] == ["Ended", "Chunk"] and got[1].audio.tolist() == [7.0, 7.0, 7.0]


def test_a_break_frees_a_send_stuck_on_a_caller_that_reads_nothing(tmp_path, monkeypatch):
    """Broken by its queue's bound while its thread is stuck sending to a caller that reads nothing,
    a writer ends its calls at once, not after GIVE_UP_S."""
    monkeypatch.setattr(audio_channel, "MAX_QUEUED_BYTES", 4 << 20)
    monkeypatch.setattr(audio_channel, "GIVE_UP_S", 30.0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, never reads
    listener.bind(str(tmp_path / "chan-4-0123abcd.sock"))
    listener.listen(1)
    w = audio_channel.Writer(str(tmp_path / "chan-4-0123abcd.sock"))
    ended = []
    chunk = np.zeros(16_384, np.float32)  # 64 KiB
    for _ in range(16):  # the socket's buffers fill: the writer's thread waits in its send
        w.chunk("0123456789abcdef", 1, chunk)
    time.sleep(0.3)
    assert w.written < 16 and not w.broken
    t0 = time.monotonic()
    for _ in range(100):  # then the queue, past its bound
        w.chunk("0123456789abcdef", 1, chunk)
    w.end("0123456789abcdef", None, ended.append)
    assert w.broken and w.drain(time.monotonic() + 10) and ended == [True]
    assert time.monotonic() - t0 < 10
    listener.close()


def test_a_connection_that_sends_what_is_not_a_frame_is_closed(tmp_path, caplog):
    """Garbage, or a header with sizes past MAX_FRAME_BYTES: the rest of that byte stream cannot be
    trusted, so the connection is closed (its writer breaks); other connections go on."""
    async def main():
        got = []
        listener = audio_channel.Listener(asyncio.get_running_loop(), str(tmp_path / "chan.sock"),
                                          lambda token, item: got.append((token, type(item).__name__)))
        clients = []
        for bad in (b"garbage" * 10, audio_channel._HEADER.pack(audio_channel._MAGIC, audio_channel._CHUNK,
                                                                 b"0123456789abcdef", 1, 1 << 30, 0)):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(2)  # a connection left open fails the test below, not hangs it
            c.connect(listener.path)
            c.sendall(bad)
            clients.append(c)
        good = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        good.connect(listener.path)
        for part in audio_channel._frame(audio_channel._END, "fedcba9876543210", message="fine"):
            good.sendall(part)
        await asyncio.sleep(0.2)
        listener.read_all()
        closed = []
        for c in clients:  # the listener's end is gone: end of file
            try:
                closed.append(c.recv(1) == b"")
            except socket.timeout:
                closed.append(False)
        listener.close()
        for c in clients + [good]:
            c.close()
        return got, closed

    got, closed = asyncio.run(main())
    assert got == [("fedcba9876543210", "Ended")] and closed == [True, True] and "not a frame" in caplog.text


def test_a_calls_end_counted_in_the_read_that_read_the_channel_before_it_keeps_its_audio(run_dir):
    """The inbox reads its channel, then its counts: frames written after that channel read, with the
    final response's count read in the same pass, are still read before the call's end."""
    async def main():
        _, stream, sender = await _started_call("admitted", channel=True)
        inbox = caller._inbox[1]
        read_channel = inbox.read_channel

        def then_the_decoder_ends_the_call():
            read_channel()  # nothing yet; meanwhile the decoder writes the call's audio, its end, its count
            sender.chunk(2, np.ones(5, np.float32))
            sender.end(None)
            assert sender.channel.drain(time.monotonic() + 5)
            time.sleep(0.05)
            inbox.read_channel = read_channel

        inbox.read_channel = then_the_decoder_ends_the_call
        inbox.read()
        got = []
        while not stream.queue.empty():
            got.append(stream.queue.get_nowait())
        assert got[-1] is stream.END and _kinds(got[:-1]) == ["admitted", ("chunk", 2, 1.0), ("ended", None), None]

    asyncio.run(main())


def test_a_call_on_the_channel_waits_for_the_decoder_without_the_waiting_thread(run_dir, monkeypatch):
    """Admitted (its empty first response and the channel's Opened), a call may wait long for a slot
    in the decoder with nothing sent: it is not handed to a thread waiting in the iterator."""
    monkeypatch.setattr(caller, "FALLBACK_S", 0.2)
    monkeypatch.setattr(caller, "GRACE_S", 0.2)

    async def main():
        _, stream, sender = await _started_call("admitted", channel=True)
        sender.open()
        await asyncio.sleep(1.0)  # five fallback periods with no count and no frame
        assert stream.channeled and not stream.threaded
        sender.chunk(1, np.zeros(3, np.float32))
        sender.end(None)
        assert _kinds(await _drain(stream)) == ["admitted", ("chunk", 1, 0.0), ("ended", None), None]

    asyncio.run(main())


def test_a_stream_its_reader_left_holds_no_response_and_no_timer(run_dir):
    """The orchestrator stops reading a channel call at its end frame, before the final response: the
    stream must not keep that response (nor anything else) queued, and once done no timer may keep
    the stream alive. Either would free a response after finalize, in the stub's teardown: a crash."""
    async def main():
        _, stream, sender = await _started_call("admitted", channel=True)
        sender.open()
        sender.chunk(1, np.zeros(3, np.float32))
        assert stream.timer is not None
        assert (await asyncio.wait_for(stream.queue.get(), 5)).value == "admitted"
        stream.abandon()  # the chunk still queued goes now
        assert stream.queue.empty()
        sender.end(None)
        assert sender.channel.drain(time.monotonic() + 5)
        deadline = time.monotonic() + 5
        while not stream.done:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert [stream.queue.get_nowait()] == [stream.END] and stream.timer is None

    asyncio.run(main())


@pytest.mark.parametrize("why", ["client_left", "unhealthy"])
def test_a_guarded_wait_given_up_leaves_nothing_waiting(run_dir, monkeypatch, why):  # run_dir: none made in /tmp
    """`guard` giving up (the client left: None; a model process died: Unhealthy) cancels what it
    awaited: a queue's get left running would take the queue's next item from whoever reads it next."""
    from voxcpm_triton.serving import internal_calls

    def check(self):
        if why == "unhealthy":
            raise internal_calls.Unhealthy("a model process died")

    monkeypatch.setattr(internal_calls, "HEALTH_CHECK_S", 0.05)
    monkeypatch.setattr(internal_calls._Health, "check", check)

    async def main():
        q: asyncio.Queue = asyncio.Queue()
        if why == "unhealthy":
            with pytest.raises(internal_calls.Unhealthy):
                await internal_calls.InternalCalls().guard(q.get())
        else:
            assert await internal_calls.InternalCalls().guard(q.get(), lambda: True) is None
        q.put_nowait("next")
        await asyncio.sleep(0.05)
        return q.get_nowait()

    assert asyncio.run(main()) == "next"


def test_normalize_requests_past_the_waiting_bound_are_busy_even_in_one_turn_of_the_loop(monkeypatch):
    """tts_stream's max_normalize_waiting: 2 in flight and that many waiting, the rest refused at once,
    also when they all arrive in one turn of the event loop (a bound read off the semaphore let all
    ten through: none had taken its slot yet); every count is given back, however a call ends."""
    from voxcpm_triton.serving import internal_calls

    release = None

    class Call:
        async def async_exec(self):
            await release.wait()
            return "response"

    monkeypatch.setattr(internal_calls, "bls", lambda *a, **kw: Call())
    monkeypatch.setattr(internal_calls, "outputs", lambda response, names: [np.array([b"said"], dtype=object)])

    async def main():
        nonlocal release
        release = asyncio.Event()
        calls = internal_calls.InternalCalls(max_normalize_waiting=1)
        results = await asyncio.wait_for(asyncio.gather(
            *(calls.normalize("1 2 3", lambda: False) for _ in range(10)), release_soon(), return_exceptions=True), 10)
        assert calls.normalizing == 0
        return results[:10]

    async def release_soon():
        await asyncio.sleep(0.1)
        release.set()

    results = asyncio.run(main())
    busy = [r for r in results if isinstance(r, internal_calls.Busy)]
    assert results.count("said") == 3 and len(busy) == 7, results
    assert all("max_normalize_waiting" in str(b) for b in busy)


def test_a_cancel_the_decoder_never_answers_lets_go_of_its_call(run_dir, monkeypatch):  # run_dir: none made in /tmp
    """The orchestrator's cancel call gives up after END_TIMEOUT_S: its stream is abandoned, so
    what it holds, or gets later, is not kept until the stream is freed (after finalize: a crash)."""
    from voxcpm_triton.serving import orchestrator

    monkeypatch.setattr(orchestrator, "END_TIMEOUT_S", 0.2)

    class Unanswered:
        END = object()

        def __init__(self):
            self.queue: asyncio.Queue = asyncio.Queue()
            self.queue.put_nowait(Response("first"))  # then nothing, no END
            self.abandoned = False

        def abandon(self):
            self.abandoned = True

    stream = Unanswered()
    orch = orchestrator.Orchestrator.__new__(orchestrator.Orchestrator)
    orch.calls = orchestrator.InternalCalls()  # (imported there from internal_calls)
    orch.calls.call_decoupled = lambda model, inputs, names: stream
    asyncio.run(asyncio.wait_for(orch._cancel_decoder("r1"), 5))
    assert stream.abandoned


def test_a_failed_call_hands_over_its_exception(run_dir):
    async def main():
        async def fails():
            raise RuntimeError("model 'decoder' is not ready")

        stream = caller.call(lambda params: fails())
        await asyncio.wait_for(stream.started.wait(), 5)
        got = await _drain(stream)
        assert len(got) == 1 and isinstance(got[0], RuntimeError) and "not ready" in str(got[0])
        assert not stream.returned and not caller._inbox[1].streams

        def raises_at_once(params):
            raise ValueError("bad request")

        with pytest.raises(ValueError):
            caller.call(raises_at_once)
        assert not caller._inbox[1].streams, "a call that never started is forgotten"

    asyncio.run(main())


def test_the_callee_counts_only_for_callers_of_this_server_that_ask(run_dir):
    import json

    plain = Sender(None)
    inbox = str(run_dir / "bls-12-0123abcd.sock")
    token = "0123456789abcdef"
    for value in ("no-token", 7, None, f"{inbox} {token} x", f"{inbox} short",
                  f"/tmp/bls-12-0123abcd.sock {token}",  # not in this server's run directory
                  f"{run_dir}/../bls-12-0123abcd.sock {token}", f"{run_dir}/other.sock {token}"):
        params = json.dumps({protocol.PARAMETER: value})
        assert callee.counting_sender(Request(params, outputs=["LATENTS"]), plain, FINAL) is plain, value
        # not counted, but its errors after the first response still travel as data
        carrying = callee.counting_sender(Request(params), plain, FINAL)
        assert type(carrying) is callee.CarryingSender and carrying.sender is plain, value
    for params in ("", "{}", '{"other": 1}', "not json"):
        assert callee.counting_sender(Request(params, outputs=[]), plain, FINAL) is plain, params
        assert type(callee.counting_sender(Request(params), plain, FINAL)) is callee.CarryingSender
    counting = callee.counting_sender(Request(json.dumps({protocol.PARAMETER: f"{inbox} {token}"})),
                                          plain, FINAL)
    assert isinstance(counting, callee.CountingSender) and counting.path == inbox


def test_a_callee_config_that_delivers_later_or_cannot_carry_errors_is_refused():
    error = {"name": "ERROR", "data_type": "TYPE_STRING", "dims": [1]}
    good = {"model_transaction_policy": {"decoupled": True}, "output": [error]}
    callee.check_callee_config(good, "decoder")
    for bad in ({**good, "response_cache": {"enable": True}}, {**good, "dynamic_batching": {"preserve_ordering": True}},
                {**good, "output": []}, {**good, "output": [{**error, "data_type": "TYPE_FP32"}]}):
        with pytest.raises(ValueError, match="model 'decoder'"):
            callee.check_callee_config(bad, "decoder")


def test_a_full_socket_keeps_the_latest_count_and_retries(tmp_path, monkeypatch, caplog):
    path = str(tmp_path / "caller.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    notifier = callee.Notifier()
    n = 0
    while not notifier.pending:  # fill the caller's socket until a count does not fit
        n += 1
        notifier.sent(path, "tok", n, final=False)
        assert n < 100_000, "the socket never filled"
    notifier.sent(path, "other", 3, final=False)
    notifier.sent(path, "tok", n + 1, final=True)
    notifier.sent(path, "tok", n, final=False)  # a smaller count, later: the larger one stays, final
    assert notifier.pending[path] == {"tok": (n + 1, True), "other": (3, False)}
    rx.settimeout(5)
    lines: list[str] = []
    while f"tok {n + 1} 1" not in lines:
        lines += rx.recv(65536).decode().split("\n")
    assert "other 3 0" in lines, "a caller's pending counts go out together"
    deadline = time.monotonic() + 5
    while notifier.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not notifier.pending
    notifier.sent(str(tmp_path / "gone.sock"), "tok", 1, final=True)  # a caller that has exited
    assert not notifier.pending
    # A caller that reads nothing: its counts are dropped after GIVE_UP_S, not retried for ever.
    monkeypatch.setattr(callee, "GIVE_UP_S", 0.3)
    while not notifier.pending:
        n += 1
        notifier.sent(path, "tok", n, final=False)
    deadline = time.monotonic() + 5
    while notifier.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not notifier.pending and "has read nothing" in caplog.text
    rx.close()


def test_close_removes_the_socket_and_lets_go_of_finished_iterators(run_dir):
    async def main():
        it = BufferedIterator(Response("only", final=True))
        stream, params = _call(it)
        _counting(params, it).send("only", flags=FINAL)
        await _drain(stream)

    asyncio.run(main())
    assert glob.glob(str(run_dir / "bls-*.sock")) and glob.glob(str(run_dir / "chan-*.sock")) and caller._graves
    caller.close()
    assert not glob.glob(str(run_dir / "*.sock")) and not caller._graves


def test_the_stress_models_read_counted_under_load_without_a_stall_or_crash(tmp_path):
    """benchmarks/bls_stress on a real server, as the orchestrator reads the decoder: 64 calls in
    flight, each final flag right after its call's last response. Before serving/bls (a thread
    waiting in each iterator) this pattern stalled the caller within a few rounds
    (benchmarks/results.md); every call here must finish whole, and the server stop cleanly."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bls_stress import _round

    from tests.server import TritonServer

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with TritonServer(REPO / "benchmarks" / "bls_stress", env={"VOXCPM_RUN_DIR": str(run_dir)}) as srv:
        for _ in range(2):
            calls, waiting, errors = _round(srv.grpc_url, clients=1, seconds=6, concurrency=64, responses=5,
                                            mode="counted", timeout=60)
            assert calls is not None, f"stalled\n{srv.log_tail()}"
            assert not errors and calls > 64, (calls, errors)
            assert waiting == 0, f"{waiting} of {calls} calls were read by a waiting thread"
        assert glob.glob(str(run_dir / "bls-*.sock")), "the caller reads counts on its socket"
    assert srv.returncode == 0 and not srv.leftover_processes, srv.log_tail(80)
    assert "Fatal Python error" not in srv.log, srv.log[srv.log.index("Fatal Python error"):][:3000]
    assert not glob.glob(str(run_dir / "bls-*.sock")), "the socket goes with its process"
    assert not glob.glob(str(run_dir / "chan-*.sock")), "so does its audio channel's"


def test_a_count_the_kernel_had_no_memory_for_is_retried(tmp_path, monkeypatch, caplog):
    """ENOBUFS/ENOMEM from sendto is the kernel short of memory now, not a caller gone: the count is
    retried (a channel call's final count dropped there would leave its call open until finalize).
    Only the errors that say the caller is gone drop it at once; any other is retried until GIVE_UP_S
    and named when its counts are dropped."""
    path = str(tmp_path / "caller.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    notifier = callee.Notifier()
    real = notifier.sock

    class Failing:
        def __init__(self, errors):
            self.errors, self.calls = list(errors), 0

        def sendto(self, data, to):
            self.calls += 1
            if self.errors:
                code = self.errors.pop(0)
                raise OSError(code, os.strerror(code))
            return real.sendto(data, to)

    notifier.sock = Failing([errno.ENOBUFS, errno.ENOMEM])
    notifier.sent(path, "tok", 1, final=True)
    rx.settimeout(5)
    assert rx.recv(65536).decode() == "tok 1 1"
    assert notifier.sock.calls == 3 and not notifier.sock.errors
    for gone in (errno.ECONNREFUSED, errno.ENOENT):  # dropped at once: not retried
        notifier.sock = Failing([gone])
        notifier.sent(path, "tok", 2, final=True)
        assert notifier.sock.calls == 1 and not notifier.pending
    monkeypatch.setattr(callee, "GIVE_UP_S", 0.2)
    notifier.sock = Failing([errno.EPERM] * 1_000_000)
    notifier.sent(path, "tok", 3, final=True)
    deadline = time.monotonic() + 5
    while notifier.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    with notifier.lock:
        assert not notifier.pending and not notifier.why and notifier.sock.calls > 1
    assert f"sending failed: [Errno {errno.EPERM}]" in caplog.text
    rx.close()
    real.close()


def test_many_pending_counts_go_in_datagrams_that_fit(tmp_path):
    """A caller's pending counts are cut into datagrams of at most DATAGRAM_BYTES: as one they would
    pass the socket's size limit (EMSGSIZE) past a few thousand calls. What did not fit in the
    caller's queue is sent as it reads."""
    path = str(tmp_path / "caller.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    notifier = callee.Notifier()
    calls = {f"{i:016x}": (i, i % 2 == 0) for i in range(12_000)}  # ~370 KB of counts
    expected = {f"{t} {c} {int(f)}" for t, (c, f) in calls.items()}
    with notifier.lock:
        if not notifier._send(path, calls):
            notifier.pending[path], notifier.since[path] = calls, time.monotonic()
            notifier.wake.set()
    rx.settimeout(5)
    got: set[str] = set()
    while got != expected:
        data = rx.recv(65536)
        assert len(data) <= callee.DATAGRAM_BYTES
        got |= set(data.decode().split("\n"))
        assert got <= expected
    rx.close()


def test_a_caller_that_reads_a_backlog_slowly_keeps_its_counts(tmp_path, monkeypatch):
    """GIVE_UP_S is for a caller that reads nothing: one that drains a long backlog, datagram by datagram,
    for longer than that keeps every count."""
    monkeypatch.setattr(callee, "GIVE_UP_S", 0.3)
    path = str(tmp_path / "caller.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    notifier = callee.Notifier()
    calls = {f"{i:016x}": (i, True) for i in range(12_000)}  # ~22 datagrams, more than the queue holds
    expected = {f"{t} {c} 1" for t, (c, _) in calls.items()}
    with notifier.lock:
        assert not notifier._send(path, calls)
        notifier.pending[path], notifier.since[path] = calls, time.monotonic()
        notifier.wake.set()
    rx.settimeout(5)
    got: set[str] = set()
    t0 = time.monotonic()
    while got != expected:
        time.sleep(0.05)  # slower than GIVE_UP_S over the whole backlog
        got |= set(rx.recv(65536).decode().split("\n"))
    assert time.monotonic() - t0 > callee.GIVE_UP_S
    rx.close()
