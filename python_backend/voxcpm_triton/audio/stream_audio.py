"""Audio for the engine's latent chunks, decoded in the engine's own process (decoder parameter
`decode_audio`).

As a model of its own (`vae_decoder`) the VAE runs in another process, and a GPU shared by two
processes runs them in time slices: a chunk's decode waits for the decoder's slice, the decoder's
steps wait for the VAE's, and every chunk takes two more hops between models. Here the engine
thread only queues a request's chunks (`chunk`) and its end (`end`). One thread takes what is
queued (each request's pending chunks up to the longest graph's length a round), decodes it in
batches by length (`VAEStreams`) on a CUDA stream of the highest priority (its kernels run beside
the decode step's and go first), and hands each request its audio chunk by chunk, in order, then
its end: with its last chunk when both go in one round (one send to the client fewer), else alone.

With CUDA graphs, a request's last chunk is decoded padded with silence up to the next chunk
length that has graphs, and its audio cut back: the decoder is causal, so the audio of the real
frames is the same (to rounding), and its state after the padding is never read (the stream
closes). Last chunks come in any length (what is left when the request stops), and another length
costs several graph replays (in a batch too large for that length's graphs, the padded batch
decodes eagerly, as any such batch does). Its end goes out right after its own audio, not after
the whole round's: until then its client cannot send its next request. An end that comes alone
(its audio sent in earlier rounds) goes as soon as the round's decodes are launched.

`mark` and `fence` let the engine put first chunks' decode ahead of its next step: the fence waits
until what is queued has been launched and returns an event after it on the audio stream, for the
engine's stream to wait on. (A high priority only orders kernels that wait at the same time: a
step's persistent kernels hold every SM, and a decode launched behind them trickles between them.)

A round's batch of its longest chunks (at 64 streams most of its requests) is delivered last, one
request at a time (over the audio channel a send only queues a frame; without it, each is a round
trip to the server, tens of milliseconds under load), and a wave of requests that end together
makes it long. A chunk queued meanwhile would wait for all of it; so before each of those deliveries (ending requests' too), a request whose
client has heard nothing yet, or would run out of audio before the round's remaining deliveries are
done (`RUSH_MARGIN_S` to spare), is decoded and delivered at once ("rushed"), alone or with others
like it, and so is an end queued alone. Only in that batch: the round's decodes are done on the GPU
by then, so the rushed decode does not queue behind them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .. import timeline
from ..gpu.buckets import smallest_at_least
from ..model.audio_vae import AudioVAE, patch_frames
from .vae_streams import StreamSlotsFull, VAEStreams

log = logging.getLogger("voxcpm_triton.stream_audio")

# Out-of-range priorities are clamped: this asks for the highest the device has.
HIGHEST_PRIORITY = -100

# A queued chunk is rushed (module doc) when its client would otherwise be left with less audio than
# this once the round's remaining deliveries are done.
RUSH_MARGIN_S = 0.05

_NO_END = object()


@dataclass
class _Request:
    # deliver(patches [n, P, D], audio [n * P * hop]) per chunk, the last one as deliver(patches, audio,
    # end) when its end is known by then, else deliver(None, end) once after the chunks. Ends are not None.
    deliver: Callable[..., None]
    context: torch.Tensor | None  # [1, D, frames]: latents the VAE is primed with (continuation)
    pending: list = field(default_factory=list)  # chunks [n, P, D] queued, not decoded yet
    end: Any = _NO_END
    end_seen: bool = False  # its end has been queued
    opened: bool = False
    failed: bool = False
    done: bool = False  # its end (or its failure) has been delivered
    first_at: float | None = None  # monotonic time of its first chunk's delivery
    sent_s: float = 0.0  # seconds of audio delivered

    def buffered_s(self, now: float) -> float | None:
        """The audio its client still has to play at `now`, if it plays from its first chunk on."""
        return None if self.first_at is None else self.sent_s - (now - self.first_at)


class StreamAudio:
    """`open` a request, queue its `chunk`s and its `end` (any thread); its `deliver` is called from
    this object's thread. A request whose decode fails gets `deliver(None, error)` at once and
    nothing after; `on_failure(key, error)` is told so that its generation stops too."""

    def __init__(self, vae: AudioVAE, patch_size: int, max_streams: int, cuda_graphs: bool,
                 graph_patches, on_failure: Callable[[Any, Exception], None], rush: bool = True):
        """rush: chunks that cannot wait for the round's end go between its deliveries (module doc)."""
        self.P = patch_size
        self.rate = vae.out_sample_rate
        # Patches of one request decoded in one round (a longer chunk alone goes whole): what lags
        # behind decodes in pieces, not as one ever larger decode.
        self.max_patches = max(graph_patches)
        self.graph_patches = sorted(set(graph_patches))
        self.streams = VAEStreams(vae, patch_size, max_streams, cuda_graphs=cuda_graphs,
                                  graph_patches=graph_patches)
        # Without graphs a decode costs its frames, and padding would only add to them.
        self.pad_last = bool(self.streams.graphs)
        self.device = vae.device
        self.cuda_stream = (torch.cuda.Stream(self.device, priority=HIGHEST_PRIORITY)
                            if self.device.type == "cuda" else None)
        self.on_failure = on_failure
        self.requests: dict = {}  # key -> _Request, from open to its end's delivery
        self.queued: dict = {}  # key -> _Request with work queued, in arrival order
        self.lock = threading.RLock()  # re-entrant, as a Condition's own (tests hold it while queueing)
        self.cond = threading.Condition(self.lock)  # work queued, or stopping
        self.fences = threading.Condition(self.lock)  # what `fence` waits on: a round's decodes launched
        self.chunks_queued = 0  # chunks ever queued
        self.chunks_launched = 0  # of those, queued before a round that has launched its decodes
        self.launch_event = None  # recorded on the audio stream after that round's decodes
        self.round_upto = None  # while a round runs: chunks_queued when it took its work
        self.round_since = None  # while a round runs: when it began (monotonic; a stuck send shows here)
        self.stopping = False
        self.exited = False  # the thread has taken its last work (it may not have ended yet)
        self.last_batch = 0  # requests decoded together in the latest round
        self.send_s = 1e-3  # a delivery's time, a moving average (the rush's estimate of a round's rest)
        self.rushed = 0  # rushes that decoded something (not only put requests back), so far
        self.sends, self.send_seconds = 0, 0.0  # deliveries (chunks, ends alone) and their time, so far
        self.ends_alone = 0  # ends delivered without a chunk (their audio went in an earlier round)
        self.rush = rush
        self._rushing = False
        self.thread = threading.Thread(target=self._run, name="voxcpm-stream-audio", daemon=True)
        self.thread.start()

    def __len__(self) -> int:
        """Requests opened and not yet ended."""
        with self.cond:
            return len(self.requests)

    def open(self, key, deliver: Callable[..., None], context=None) -> None:
        """Register request `key`; `context` [n, P, D] latent patches prime its VAE stream."""
        if context is not None and len(context):
            context = patch_frames(torch.as_tensor(context, dtype=torch.float32))
        else:
            context = None
        with self.cond:
            if self.stopping:
                raise RuntimeError("the audio decoder is shut down")
            if key in self.requests:
                raise ValueError(f"audio stream {key!r} is already open")
            self.requests[key] = _Request(deliver, context)

    def forget(self, key) -> None:
        """Drop a request opened here that never ran (nothing is delivered to it)."""
        with self.cond:
            self.requests.pop(key, None)

    def chunk(self, key, patches: torch.Tensor) -> None:
        """Queue a chunk: patches [n, P, D], float32 on the CPU (the engine's)."""
        self._queue(key, patches)

    def end(self, key, end, drop_pending: bool = False) -> None:
        """The request's end (whatever `deliver` takes as one, but not None), delivered with its last
        chunk or after it. drop_pending: its chunks not yet taken by a round are dropped, neither
        decoded nor delivered (its client has gone, or cancelled it)."""
        if end is None:
            raise ValueError("an end cannot be None: deliver(patches, audio, end=None) is a chunk")
        self._queue(key, None, end, drop_pending)

    def drop_pending(self, which: Callable[[object], bool]) -> int:
        """Drop the chunks not yet taken by a round of the open requests whose key `which` selects
        (cancelled after the engine had ended them: its end still goes) -> how many were dropped."""
        with self.cond:
            dropped = 0
            for key, r in self.requests.items():
                if which(key) and r.pending:
                    dropped += len(r.pending)
                    r.pending.clear()
            return dropped

    def _queue(self, key, patches, end=_NO_END, drop_pending=False):
        with self.cond:
            r = self.requests.get(key)
            if r is None or r.failed:
                if r is not None and end is not _NO_END:
                    r.end_seen = True
                    del self.requests[key]  # its failure was its end
                return
            if self.exited:  # too late to decode: only its end goes
                if end is not _NO_END:
                    del self.requests[key]
                    r.done = True
                    late = r
                else:
                    return
            else:
                late = None
                if drop_pending:
                    r.pending.clear()
                if patches is not None:
                    r.pending.append(patches)
                    self.chunks_queued += 1
                if end is not _NO_END:
                    r.end, r.end_seen = end, True
                self.queued[key] = r
                self.cond.notify()
        if late is not None:
            self._deliver(key, late, None, end)

    def mark(self) -> int:
        """Where the queue stands now: `fence(mark, ...)` does not wait for rounds of older chunks."""
        with self.lock:
            return self.chunks_queued

    def fence(self, mark: int, timeout: float) -> tuple:
        """Wait (at most `timeout` s) until a round has taken every chunk queued so far and launched
        its decode: each request's oldest queued chunk at least (a request that waits for a stream
        slot is put back, not waited for). -> (launched, event): the CUDA event is recorded after
        those decodes on the audio stream, for another stream to wait on (None on the CPU, where
        they are done). (False, None) when the time ran out, or at once while the thread is busy
        with a round of chunks queued before `mark` only: its waits and deliveries are not the
        caller's to wait for. A round that took some of the chunks since `mark` is waited for (with
        the next, for the rest)."""
        with self.lock:
            target = self.chunks_queued
            busy = lambda: self.round_upto is not None and self.round_upto <= mark  # noqa: E731
            self.fences.wait_for(lambda: self.chunks_launched >= target or self.stopping or busy(), timeout)
            if self.chunks_launched >= target:
                return True, self.launch_event
            return False, None

    def stop(self, timeout: float = 10.0) -> None:
        """Decode and deliver what is queued, then end the thread."""
        with self.lock:
            self.stopping = True
            self.cond.notify()
            self.fences.notify_all()
        self.thread.join(timeout)

    # ------------------------------------------------------------------ its thread
    def _run(self):
        try:
            self._rounds()
        finally:  # also when the thread dies of an error: the ends that come later go directly
            with self.lock:
                self.exited = True

    def _rounds(self):
        torch.set_grad_enabled(False)
        while True:
            with self.cond:
                while not self.queued and not self.stopping:
                    self.cond.wait()
                if not self.queued:
                    self.exited = True  # (under the lock: whatever is queued after this goes directly)
                    return
                work, upto = self._take(), self.chunks_queued
                self.round_upto, self.round_since = upto, time.monotonic()
            launched = lambda: self._launched(upto)  # noqa: E731
            # A failed round's streams are closed on the stream of their decodes too: closing zeroes
            # their state rows, which must come after those decodes' writes.
            with torch.cuda.stream(self.cuda_stream) if self.cuda_stream is not None else contextlib.nullcontext():
                try:
                    waiting = self._round(work, launched)
                    if waiting:  # no slot for some: rounds come again at once, but not in a hot loop
                        time.sleep(0.002)
                except Exception as e:  # noqa: BLE001 - a bug here fails this round's requests, not the thread
                    log.exception("audio decoding round failed")
                    self._fail([(key, r) for key, r, *_ in work if not r.done], e)
                finally:
                    launched()  # a failed round's chunks are not waited for either
                    with self.lock:
                        self.round_upto = self.round_since = None

    def _launched(self, upto: int):
        """This round's decodes are on the GPU: fences for the chunks it took (upto) may pass."""
        if self.chunks_launched >= upto:  # told already
            return
        event = None
        if self.cuda_stream is not None:
            try:
                event = torch.cuda.Event()
                event.record(self.cuda_stream)
            except Exception:  # noqa: BLE001 - called from `finally` too: the thread must live on
                log.exception("recording the audio stream's event failed")
                event = None
        with self.lock:
            self.chunks_launched, self.launch_event = upto, event
            self.fences.notify_all()

    def _take(self, keys=None) -> list:
        """This round's work, under the lock: (key, request, chunks, end) for each request queued
        (those of `keys` only, if given), its pending chunks up to max_patches (at least one), and its
        end once no chunk is left."""
        work, later = [], {}
        for key, r in self.queued.items():
            if keys is not None and key not in keys:
                later[key] = r
                continue
            take, n = 0, 0
            while take < len(r.pending) and (take == 0 or n + len(r.pending[take]) <= self.max_patches):
                n += len(r.pending[take])
                take += 1
            chunks, r.pending = r.pending[:take], r.pending[take:]
            end = _NO_END
            if r.pending:
                later[key] = r
            else:
                end, r.end = r.end, _NO_END
            work.append((key, r, chunks, end))
        self.queued = later
        return work

    def _put_back(self, key, r: _Request, chunks: list, end):
        """A request's chunks (and end) taken this round, queued again, ahead of what came since."""
        with self.cond:
            r.pending = chunks + r.pending
            if end is not _NO_END:
                r.end = end
            self.queued[key] = r

    def _round(self, work: list, launched: Callable[[], None]) -> set:
        """Decode each request's chunks of this round as one piece: requests with the same number of
        frames in one batch (a last chunk padded, see the module's doc), every batch queued before
        the first wait (then `launched()`). A request that ends this round gets its end with its
        last chunk. -> the keys put back for want of a stream slot."""
        decodes, waiting = [], set()
        ends = {key: end for key, _, _, end in work if end is not _NO_END}
        if timeline.ON:
            timeline.event("round", [len(work), sum(len(c) for _, _, chunks, _ in work for c in chunks)])
        for key, r, chunks, end in work:
            if not chunks or r.failed:
                continue
            if not r.opened:
                try:
                    self.streams.open(key, r.context)
                except StreamSlotsFull:
                    # Requests that ended this round hold their slots until its end: next round.
                    self._put_back(key, r, chunks, end)
                    waiting.add(key)
                    continue
                except Exception as e:  # noqa: BLE001 - this request fails, the rest go on
                    self._fail([(key, r)], e)
                    continue
                r.opened = True
            patches = sum(len(c) for c in chunks)
            if key in ends and self.pad_last:
                patches = smallest_at_least(self.graph_patches, patches) or patches
            decodes.append((key, r, chunks, patches * self.P))
        batches = []
        for frames in sorted({f for *_, f in decodes}):
            group = [d for d in decodes if d[3] == frames]
            try:
                z = self._batch_frames([chunks for _, _, chunks, _ in group], frames)
                batches.append((group, frames, self.streams.decode_async([key for key, *_ in group], z)))
            except Exception as e:  # noqa: BLE001 - these requests fail, the rest go on
                self._fail([(key, r) for key, r, *_ in group], e)
        self.last_batch = len(decodes)
        launched()
        timeline.event("decodes_launched", len(batches))
        for key, r, chunks, _ in work:  # ends that came alone: their audio went out in earlier rounds
            if not chunks and key in ends and not r.failed:
                self._end(key, r, ends.pop(key))
        undelivered = {key for key, *_ in decodes}
        for b, (group, frames, pending) in enumerate(batches):
            try:
                audio = pending.result()
            except Exception as e:  # noqa: BLE001
                self._fail([(key, r) for key, r, *_ in group], e)
                undelivered.difference_update(key for key, *_ in group)
                continue
            timeline.event("decoded", [len(group), frames])
            per_patch = audio.shape[-1] // frames * self.P  # samples
            # Requests that end first: their clients wait for the end to send their next request.
            items = sorted(zip(group, audio.numpy()), key=lambda d: d[0][0] not in ends)
            sends = [len(chunks) for (_, _, chunks, _), _ in items]
            for i, ((key, r, chunks, _), a) in enumerate(items):
                # In the last batch (the round's decodes all done on the GPU), before each delivery,
                # ending requests' too: a batch of them (a wave of requests ending together) takes as long.
                if b == len(batches) - 1:
                    self._rush(undelivered, sum(sends[i:]))
                start, end = 0, ends.pop(key, _NO_END)
                for j, c in enumerate(chunks):
                    last = j == len(chunks) - 1
                    self._send_chunk(key, r, c, a[start:start + len(c) * per_patch], end if last else _NO_END)
                    start += len(c) * per_patch
                undelivered.discard(key)
        for key, r, _, _ in work:
            if key in ends and not r.failed and key not in waiting:
                self._end(key, r, ends.pop(key))
        timeline.event("round_done", len(decodes))
        return waiting

    def _send_chunk(self, key, r: _Request, patches, audio, end=_NO_END):
        """Deliver one chunk's audio (the request's last, with its `end`, if given), and keep the
        books the rush reads."""
        t0 = time.monotonic()
        if r.first_at is None:
            r.first_at = t0
        if timeline.ON:
            timeline.event("send", key[0] if isinstance(key, tuple) else key)
        r.sent_s += len(audio) / self.rate
        if end is _NO_END:
            self._deliver(key, r, patches, audio)
        else:
            self._close(key, r)
            self._deliver(key, r, patches, audio, end)
        self._sent(t0)

    def _sent(self, t0: float):
        """A delivery that began at `t0` is done: into the moving average of a send's time, and the totals."""
        took = time.monotonic() - t0
        self.send_s += 0.1 * (took - self.send_s)
        self.sends += 1
        self.send_seconds += took

    def _rush(self, busy: set, left: int):
        """Between a round's last deliveries (`left` sends to go, to the requests in `busy`): decode and
        deliver now the queued chunks whose clients cannot wait for them (module doc)."""
        if not self.rush or self._rushing or not self.queued:  # unlocked: a chunk queued now waits one delivery
            return
        now = time.monotonic()
        wait = left * self.send_s
        with self.cond:
            keys = {key for key, r in self.queued.items() if key not in busy and not r.failed and (
                not r.pending and r.end is not _NO_END  # an end alone: its client waits for it to go on
                or r.pending and (r.first_at is None or r.buffered_s(now) < wait + RUSH_MARGIN_S))}
            if not keys:
                return
            work = self._take(keys)
            # What a fence waits for: with nothing left queued, every chunk so far is launched with these.
            upto = None if self.queued else self.chunks_queued
        self._rushing, last_batch = True, self.last_batch
        waiting = set()
        try:
            # A request with no stream slot free yet is put back, for the next round.
            waiting = self._round(work, lambda: upto is not None and self._launched(upto))
        except Exception as e:  # noqa: BLE001 - as a failed round: these requests fail, the round goes on
            log.exception("rushed audio decoding failed")
            self._fail([(key, r) for key, r, *_ in work if not r.done], e)
            if upto is not None:  # as a failed round's: its chunks are not waited for
                self._launched(upto)
        finally:
            self._rushing, self.last_batch = False, last_batch
            self.rushed += any(chunks for key, _, chunks, _ in work if key not in waiting)

    @staticmethod
    def _batch_frames(requests: list, frames: int) -> torch.Tensor:
        """Each request's chunks [n, P, D] as its row of [B, D, frames] latent frames, silence after
        them up to `frames`, in a fixed number of copies whatever the requests: no copy per request
        (each can let go of the GIL: engine._host_rows)."""
        d = requests[0][0].shape[-1]
        lengths = np.array([sum(c.shape[0] * c.shape[1] for c in chunks) for chunks in requests])  # frames each
        flat = torch.cat([c for chunks in requests for c in chunks]).numpy().reshape(-1, d)
        z = np.zeros((len(requests), frames, d), np.float32)
        z[np.arange(frames) < lengths[:, None]] = flat  # row-major: each request's frames in order
        return torch.from_numpy(np.ascontiguousarray(z.transpose(0, 2, 1)))

    def _end(self, key, r: _Request, end):
        """Deliver a request's end alone (its audio went before): a send, in the rush's books."""
        t0 = time.monotonic()
        self._close(key, r)
        self._deliver(key, r, None, end)
        self._sent(t0)
        self.ends_alone += 1

    def _close(self, key, r: _Request):
        """Before its end's delivery: close the request's VAE stream (after its decodes, on their CUDA
        stream) and let go of it."""
        self.streams.close(key)
        with self.cond:
            self.requests.pop(key, None)
        r.done = True

    def _deliver(self, key, r: _Request, patches, payload, *end):
        try:
            r.deliver(patches, payload, *end)
        except Exception:  # noqa: BLE001 - a broken receiver is the request's, not the thread's
            log.exception("delivering audio of request %r failed", key)

    def _fail(self, failed: list, error: Exception):
        """(key, request) pairs whose audio cannot be made: each gets `error` as its end."""
        log.error("decoding audio of %d request(s) failed: %s", len(failed), error)
        for key, r in failed:
            self.streams.close(key)
            with self.cond:
                r.failed, r.pending, r.done = True, [], True
                if r.end_seen:  # else its end, still to come, is dropped (`_queue`)
                    self.requests.pop(key, None)
                    ended = True
                else:
                    ended = False
            if not ended:  # first: its generation stops before its client hears of the error
                self.on_failure(key, error)
            self._deliver(key, r, None, error)
