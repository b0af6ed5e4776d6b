"""bls_stream: decoupled BLS responses read only as far as the callee has counted, so no thread
waits inside Triton's response iterator (where Triton 2.51's Python backend can deadlock); and the
toy models of benchmarks/bls_stress under load on a real tritonserver."""

from __future__ import annotations

import asyncio
import collections
import glob
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from voxcpm_triton.serving import bls_stream

REPO = Path(__file__).resolve().parents[1]
FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Response:
    def __init__(self, value, final=False):
        self.value, self.final = value, final


class BufferedIterator:
    """A response iterator whose `next` must never wait: it fails if its buffer is empty."""

    def __init__(self, first):
        self.buffer = collections.deque([first])
        self.finished = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.finished:
            raise StopIteration
        if not self.buffer:
            raise AssertionError("next() called with nothing buffered: it would wait")
        r = self.buffer.popleft()
        self.finished = r.final
        return r


class WaitingIterator(BufferedIterator):
    """One whose `next` waits for a response, as Triton's does."""

    def __init__(self, first):
        super().__init__(first)
        self.cond = threading.Condition()
        self.waited = 0

    def deliver(self, r):
        with self.cond:
            self.buffer.append(r)
            self.cond.notify_all()

    def __next__(self):
        with self.cond:
            if not self.buffer and not self.finished:
                self.waited += 1
            self.cond.wait_for(lambda: self.buffer or self.finished)
            return super().__next__()


class Sender:
    """A callee's response sender: what it sends is buffered in the caller's iterator (as the
    server does before `send` returns)."""

    def __init__(self, iterator):
        self.iterator, self.sent = iterator, 0

    def send(self, response=None, flags=0):
        if self.sent:  # the first response is the one the call returns with
            self.iterator.buffer.append(Response(response, bool(flags & FINAL)))
        self.sent += 1

    def is_cancelled(self):
        return False


class Request:
    def __init__(self, parameters: str, sender=None):
        self._parameters, self.sender = parameters, sender

    def parameters(self):
        return self._parameters

    def get_response_sender(self):
        return self.sender


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXCPM_RUN_DIR", str(tmp_path))
    yield tmp_path
    bls_stream.close()


async def _drain(stream, timeout=10.0):
    out = []
    while (r := await asyncio.wait_for(stream.queue.get(), timeout)) is not stream.END:
        out.append(r)
    return out


def _callee_sender(params: dict, iterator) -> bls_stream.NotifyingSender:
    import json

    sender = bls_stream.sender_for(Request(json.dumps(params), Sender(iterator)), FINAL)
    assert isinstance(sender, bls_stream.NotifyingSender)
    return sender


def test_responses_are_read_as_far_as_counted_and_next_never_waits(run_dir):
    async def main():
        stream, params = bls_stream.expect()
        assert set(params) == {bls_stream.PARAMETER}
        first = Response("r1")
        it = BufferedIterator(first)
        sender = _callee_sender(params, it)
        sender.send("r1")  # counted before the call has even returned: the count waits for the iterator

        async def call():
            await asyncio.sleep(0.05)
            return it

        stream.start(call())
        await stream.started.wait()
        sender.send("r2")
        sender.send("r3")
        await asyncio.sleep(0.05)
        sender.send(flags=FINAL)  # the final flag alone, as the decoder sends it
        got = await _drain(stream)
        assert [r.value for r in got] == ["r1", "r2", "r3", None] and got[-1].final
        assert stream.token not in bls_stream._inbox[1].streams, "a finished call is forgotten"
        assert any(g is it for _, g in bls_stream._graves), "its iterator is kept a while (see _bury)"

    asyncio.run(main())


def test_many_calls_interleaved_get_each_its_own_responses(run_dir):
    async def main():
        calls = []
        for i in range(20):
            stream, params = bls_stream.expect()
            it = BufferedIterator(Response(f"{i}-0"))
            sender = _callee_sender(params, it)
            sender.send(f"{i}-0")

            async def call(it=it):
                return it

            stream.start(call())
            calls.append((stream, sender))
        for k in range(1, 4):
            for i, (_, sender) in enumerate(calls):
                sender.send(f"{i}-{k}", flags=FINAL if k == 3 else 0)
        for i, (stream, _) in enumerate(calls):
            assert [r.value for r in await _drain(stream)] == [f"{i}-{k}" for k in range(4)]
        assert not bls_stream._inbox[1].streams

    asyncio.run(main())


def test_a_call_nobody_counts_is_read_by_a_waiting_thread(run_dir):
    """A callee that does not count (or the server's own error response, a call's only one)."""
    async def main():
        stream, _ = bls_stream.expect()  # the parameter is not passed on: nothing will count
        it = WaitingIterator(Response("only"))

        async def call():
            return it

        stream.start(call())
        assert (await asyncio.wait_for(stream.queue.get(), 5)).value == "only"
        t0 = time.monotonic()
        it.deliver(Response("late", final=True))
        assert (await asyncio.wait_for(stream.queue.get(), 5)).value == "late"
        assert time.monotonic() - t0 < bls_stream.GRACE_S + 2
        assert await asyncio.wait_for(stream.queue.get(), 5) is stream.END
        assert stream.threaded

    asyncio.run(main())


def test_counts_that_stop_on_an_open_call_hand_it_to_a_waiting_thread(run_dir, monkeypatch, caplog):
    monkeypatch.setattr(bls_stream, "FALLBACK_S", 0.5)

    async def main():
        stream, params = bls_stream.expect()
        it = WaitingIterator(Response("r1"))
        sender = _callee_sender(params, it)
        sender.send("r1")

        async def call():
            return it

        stream.start(call())
        assert (await asyncio.wait_for(stream.queue.get(), 5)).value == "r1"
        await asyncio.sleep(1.0)  # no count: the thread takes over and waits in the iterator
        assert stream.threaded
        it.deliver(Response("uncounted", final=True))
        assert [r.value for r in await _drain(stream)] == ["uncounted"]

    asyncio.run(main())
    assert "no response count" in caplog.text


def test_a_failed_call_hands_over_its_exception(run_dir):
    async def main():
        stream, _ = bls_stream.expect()

        async def call():
            raise RuntimeError("model 'decoder' is not ready")

        stream.start(call())
        await asyncio.wait_for(stream.started.wait(), 5)
        got = await _drain(stream)
        assert len(got) == 1 and isinstance(got[0], RuntimeError) and "not ready" in str(got[0])
        assert not bls_stream._inbox[1].streams

    asyncio.run(main())


def test_the_sender_counts_only_for_callers_of_this_server_that_ask(run_dir):
    import json

    plain = Sender(None)
    inbox = str(run_dir / "bls-12-0123abcd.sock")
    token = "0123456789abcdef"
    for value in ("no-token", 7, None, f"{inbox} {token} x", f"{inbox} short",
                  f"/tmp/bls-12-0123abcd.sock {token}",  # not in this server's run directory
                  f"{run_dir}/../bls-12-0123abcd.sock {token}", f"{run_dir}/other.sock {token}"):
        params = json.dumps({bls_stream.PARAMETER: value})
        assert bls_stream.sender_for(Request(params, plain), FINAL) is plain, value
    for params in ("", "{}", '{"other": 1}', "not json"):
        assert bls_stream.sender_for(Request(params, plain), FINAL) is plain, params
    counting = bls_stream.sender_for(Request(json.dumps({bls_stream.PARAMETER: f"{inbox} {token}"}), plain), FINAL)
    assert isinstance(counting, bls_stream.NotifyingSender) and counting.path == inbox


def test_a_full_socket_keeps_the_latest_count_and_retries(tmp_path):
    path = str(tmp_path / "caller.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    notifier = bls_stream.Notifier()
    n = 0
    while not notifier.pending:  # fill the caller's socket until a count does not fit
        n += 1
        notifier.sent(path, "tok", n, final=False)
        assert n < 100_000, "the socket never filled"
    notifier.sent(path, "tok", n + 1, final=True)
    assert notifier.pending[(path, "tok")] == (n + 1, True), "the latest count is kept"
    rx.settimeout(5)
    last = None
    while last is None or not last.endswith(" 1"):
        last = rx.recv(256).decode()
    assert last == f"tok {n + 1} 1", "counts arrive in order, the final one last"
    deadline = time.monotonic() + 5
    while notifier.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not notifier.pending
    notifier.sent(str(tmp_path / "gone.sock"), "tok", 1, final=True)  # a caller that has exited
    assert not notifier.pending
    rx.close()


def test_close_removes_the_socket_and_lets_go_of_finished_iterators(run_dir):
    async def main():
        stream, params = bls_stream.expect()
        it = BufferedIterator(Response("only", final=True))
        _callee_sender(params, it).send("only", flags=FINAL)

        async def call():
            return it

        stream.start(call())
        await _drain(stream)

    asyncio.run(main())
    assert glob.glob(str(run_dir / "bls-*.sock")) and bls_stream._graves
    bls_stream.close()
    assert not glob.glob(str(run_dir / "bls-*.sock")) and not bls_stream._graves


def test_the_stress_models_read_counted_under_load_without_a_stall_or_crash(tmp_path):
    """benchmarks/bls_stress on a real server, as the orchestrator reads the decoder: 64 calls in
    flight, each final flag right after its call's last response. Before bls_stream (a thread
    waiting in each iterator) this pattern stalled the caller within a few rounds
    (benchmarks/results.md); every call here must finish whole, and the server stop cleanly."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bls_stress import _round

    from tests.server import TritonServer

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with TritonServer(REPO / "benchmarks" / "bls_stress", env={"VOXCPM_RUN_DIR": str(run_dir)}) as srv:
        for _ in range(2):
            calls, errors = _round(srv.grpc_url, clients=1, seconds=6, concurrency=64, responses=5,
                                   mode="counted", timeout=60)
            assert calls is not None, f"stalled\n{srv.log_tail()}"
            assert not errors and calls > 64, (calls, errors)
        assert glob.glob(str(run_dir / "bls-*.sock")), "the caller reads counts on its socket"
    assert srv.returncode == 0 and not srv.leftover_processes
    assert "Fatal Python error" not in srv.log, srv.log[srv.log.index("Fatal Python error"):][:3000]
    assert not glob.glob(str(run_dir / "bls-*.sock")), "the socket goes with its process"
