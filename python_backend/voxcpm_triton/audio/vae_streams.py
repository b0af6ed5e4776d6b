"""Open streams of the VAE decoder, decoded in batches.

Each stream's causal-conv state is one row of a slot pool (one tensor per look-back
convolution, [slots, C, ctx]). A batch of streams decodes as: gather their rows ->
`AudioVAE.decode_chunk` -> scatter the new state back. Row 0 is a scratch row that
padding rows read and write.

On a GPU the eager decode of a small chunk is launch-bound: a few hundred small
kernels, the same time whatever the batch. So each (batch bucket, chunk length) in `graph_patches`
is captured once as a CUDA graph, gather and scatter included, and replayed. A chunk of
another length up to the longest graph (a chunk sent early; a stream's last chunk in
`vae_decoder`, where `StreamAudio` would pad it to a graph length) is decoded as consecutive
graph-sized pieces: the causal state carries across pieces as across chunks, and
no new shape ever reaches the kernels (a new shape costs a compile or an autotune, a stall for
every stream). Larger work, where the GPU is busy anyway, runs eagerly on the same pool.
"""

from __future__ import annotations

import logging

import torch

from ..gpu.buckets import smallest_at_least
from ..gpu.cuda_graph import capture_graph
from ..gpu.host_copies import to_device, to_host
from ..model.audio_vae import AudioVAE

log = logging.getLogger("voxcpm_triton.vae_streams")

BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Captured only up to this many patches per replay (batch bucket x chunk length): past
# it the decode is bound by the GPU's work, not by launches, and graph memory grows.
MAX_GRAPH_PATCHES = 256


class StreamSlotsFull(RuntimeError):
    pass


class DecodedAudio:
    """A queued decode's audio: `result()` waits for the GPU -> [B, t * hop] on the CPU."""

    def __init__(self, parts: list, done):
        self.parts, self.done = parts, done

    def result(self) -> torch.Tensor:
        if self.done is not None:
            self.done.synchronize()
        return self.parts[0] if len(self.parts) == 1 else torch.cat(self.parts, dim=-1)


class VAEStreams:
    def __init__(self, vae: AudioVAE, patch_size: int, max_streams: int = 256, cuda_graphs: bool = False,
                 graph_patches=(1, 4, 16), batch_buckets=BATCH_BUCKETS):
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.vae, self.P, self.max_streams = vae, patch_size, max_streams
        self.device = vae.device
        self.pools = [torch.zeros(max_streams + 1, c, n, device=self.device, dtype=vae.decode_dtype)
                      for c, n in vae.stream_state_spec()]
        # Each row's view of every pool, made once: `_zero` is then one op, not one per pool
        # (engine._host_rows says why that matters).
        self.row_views = [[p[row] for p in self.pools] for row in range(max_streams + 1)]
        self.free = list(range(max_streams, 0, -1))
        self.slot: dict = {}  # stream key -> pool row
        self.clean = set(self.free)  # rows holding zeros (fresh state): a stream opened on one starts at once
        self.graphs: dict = {}  # (bucket, frames) -> (graph, idx, z, audio)
        self.buckets = tuple(b for b in batch_buckets if b <= max_streams)
        if cuda_graphs and self.device.type == "cuda":
            self._capture_all(graph_patches)

    def __len__(self) -> int:
        return len(self.slot)

    def __contains__(self, key) -> bool:
        return key in self.slot

    def open(self, key, context=None) -> None:
        """Start (or restart) stream `key` from silence; `context` [1, D, t] latent frames are fed
        through first and their audio dropped (continuation)."""
        if key not in self.slot:
            if not self.free:
                raise StreamSlotsFull(f"all {self.max_streams} VAE stream slots are in use "
                                      "(vae_decoder parameter max_streams)")
            self.slot[key] = self.free.pop()
        row = self.slot[key]
        if row not in self.clean:  # a restart: close() zeroes a row for the next stream
            self._zero(row)
        self.clean.discard(row)
        if context is not None and context.shape[-1]:
            self._body(to_device(torch.tensor([row]), self.device), to_device(context, self.device))

    def close(self, key) -> None:
        """Free `key`'s row, zeroed here (queued after its last decode) rather than when the next
        stream opens on it, so that a stream's first audio does not wait for it."""
        row = self.slot.pop(key, None)
        if row is not None:
            self._zero(row)
            self.clean.add(row)
            self.free.append(row)

    def _zero(self, row: int) -> None:
        """Row `row` of every state pool back to silence, in one launch."""
        torch._foreach_zero_(self.row_views[row])

    def decode(self, keys, z: torch.Tensor) -> torch.Tensor:
        """Next chunk of distinct open streams `keys`: z [B, D, t] -> audio [B, t * hop] on the CPU."""
        return self.decode_async(keys, z).result()

    @torch.no_grad()
    def decode_async(self, keys, z: torch.Tensor) -> "DecodedAudio":
        """`decode`, queued: the copies in, the decode and the copy out go to the GPU without a wait,
        and the handle's `result()` waits for them (`host_copies`). Batches queued before the first
        wait reach the GPU together."""
        if len(set(keys)) != len(keys):
            raise ValueError("a batch holds each stream at most once")
        rows = [self.slot[k] for k in keys]
        B, frames = len(rows), z.shape[-1]
        if frames == 0:  # END's empty chunk: nothing to decode, the state stays as it is
            return DecodedAudio([torch.zeros(B, 0)], None)
        bucket = smallest_at_least(self.buckets, B)
        pieces = self.pieces(B, frames)
        idx_in, z = to_device(torch.tensor(rows), self.device), to_device(z, self.device)
        if pieces is None:
            return self._queued([to_host(self._body(idx_in, z)[:, 0])])
        out, start = [], 0
        for n in pieces:
            g, idx, z_in, audio = self.graphs[(bucket, n)]
            idx[:B].copy_(idx_in)
            idx[B:].zero_()
            z_in[:B].copy_(z[..., start:start + n])
            g.replay()
            out.append(to_host(audio[:B, 0]))  # before the next replay of g overwrites it
            start += n
        return self._queued(out)

    def _queued(self, parts: list) -> "DecodedAudio":
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
        return DecodedAudio(parts, done)

    def pieces(self, streams: int, frames: int, past_longest: bool = False) -> list | None:
        """How `decode` runs `frames` for `streams` streams: consecutive lengths with graphs at their
        batch bucket, longest first; None: eagerly, in one go (past the longest graph, or the
        graphs cannot cover it). past_longest: pieces past the longest graph too (its replays
        first), where `decode` runs such work eagerly (benchmarks/closed_loop.py measures both)."""
        bucket = smallest_at_least(self.buckets, streams)
        if bucket is None:
            return None
        if (bucket, frames) in self.graphs:
            return [frames]
        sizes = sorted((n for b, n in self.graphs if b == bucket), reverse=True)
        if not sizes or (frames > sizes[0] and not past_longest):
            return None
        pieces, left = [], frames
        for n in sizes:
            while left >= n:
                pieces.append(n)
                left -= n
        return pieces if left == 0 else None

    def _body(self, idx: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        state = [p.index_select(0, idx) for p in self.pools]
        audio, state = self.vae.decode_chunk(z, state)
        # Padding rows all point at row 0: their order of writing does not matter.
        for p, s in zip(self.pools, state):
            p.index_copy_(0, idx, s)
        return audio

    def _capture_all(self, graph_patches) -> None:
        pool, D = None, self.vae.latent_dim
        shapes = [(b, n) for n in graph_patches for b in self.buckets if b * n <= MAX_GRAPH_PATCHES]
        # Largest first, so the smaller graphs reuse its memory in the shared pool.
        for b, n in sorted(shapes, key=lambda s: -s[0] * s[1]):
            idx = torch.zeros(b, dtype=torch.long, device=self.device)
            z = torch.zeros(b, D, n * self.P, device=self.device)
            out: list = []
            try:
                g = capture_graph(lambda: out.append(self._body(idx, z)), self.device, pool)
            except Exception as e:  # noqa: BLE001 - eager decoding still works
                log.warning("VAE graph (batch %d, %d patches) not captured, decoding eagerly: %s", b, n, e)
                continue
            pool = g.pool()
            self.graphs[(b, n * self.P)] = (g, idx, z, out[-1])
        assert all(p[1:].count_nonzero().item() == 0 for p in self.pools)  # capture wrote the scratch row only
        log.info("VAE decoder: %d CUDA graphs captured", len(self.graphs))
