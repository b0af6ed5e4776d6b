"""One decode step for the running batch: eagerly, or replayed as a CUDA graph per batch-size bucket.

The step body is the same either way. It reads and writes only persistent
buffers, so a captured graph stays valid:

    per slot (one per running request):  lm_state, res_state, prev_state
    per row (the step's batch):          slot, seed key, step index, CFG, Euler tables,
                                         KV position, slot mapping, block table, context length
    out:                                 patch + stop flag, one [rows, P*D + 1] fp32 buffer

Inside: gather the rows' state -> noise from (seed, step) -> LocDiT CFM over all
timesteps -> LocEnc -> stop head -> base LM step -> FSQ -> residual LM step ->
scatter state back. The host fills the row buffers, replays, and reads one
buffer back: the step's only device-to-host transfer. Padding rows (a batch of
5 runs in the bucket of 8) point at a spare slot and the scratch KV block.

`launch` returns before the GPU is done, so the engine prepares and launches
step N+1 while step N runs, and reads step N's result (`collect`) after that:
the GPU never waits for the host's bookkeeping. Two sets of pinned host buffers
take turns, so a launch never overwrites what an unfinished step still copies.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..cuda_graph import capture_graph
from ..local_modules import CfmSchedule, row_tables, zero_velocity_steps
from ..limits import TIMESTEPS_RANGE
from ..noise import gaussian_noise
from .attention import DecodeMetadata, PagedAttention
from .kv_cache import PagedKVCache

log = logging.getLogger("voxcpm_triton.engine")

# No bucket of 1: a lone request runs padded to 2 rows (free at these weight-bound sizes), so
# compiled code never meets a batch dimension of 1, which torch.compile would specialise in a
# separate graph (about 50 s of cold start-up).
DEFAULT_BUCKETS = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class HostBuffers:
    """Pinned host side of one step: its row inputs and its result. `free` is recorded after the
    step's copies; waiting on it makes the buffers safe to refill."""

    def __init__(self, rows: int, n_timesteps: int, max_blocks: int, out_width: int, device: torch.device):
        pin = device.type == "cuda"
        z = lambda *shape, dt=torch.int64: torch.zeros(*shape, dtype=dt, pin_memory=pin)  # noqa: E731
        self.rows = z(rows, 7)
        self.cfg = z(rows, dt=torch.float32)
        self.tables = z(3, rows, n_timesteps, dt=torch.float32)
        self.blocks = z(rows, max_blocks)
        self.out = z(rows, out_width, dt=torch.float32)
        self.free = torch.cuda.Event() if pin else None


@dataclass
class LaunchedStep:
    """A step on its way: `DecodeStepRunner.collect` waits for it and reads its result."""

    rows: int
    out: torch.Tensor  # [rows, P*D + 1] pinned host view, valid once `done` has passed
    done: torch.cuda.Event | None


class DecodeStepRunner:
    def __init__(self, model, kv: PagedKVCache, max_batch: int, max_blocks_per_seq: int, dtype, device,
                 use_cuda_graphs: bool, buckets=DEFAULT_BUCKETS, attention: str = "auto"):
        self.model, self.kv, self.dtype, self.device = model, kv, dtype, torch.device(device)
        cfg = model.cfg
        H, P, D = cfg.lm_config.hidden_size, cfg.patch_size, cfg.feat_dim
        self.P, self.D = P, D
        self.max_batch = max_batch
        self.spare_slot = max_batch  # padding rows read and write here
        S, B, N = max_batch + 1, max_batch, TIMESTEPS_RANGE[1]
        dev = self.device
        z = lambda *shape, dt=dtype: torch.zeros(*shape, dtype=dt, device=dev)  # noqa: E731
        self.lm_state, self.res_state, self.prev_state = z(S, H), z(S, H), z(S, P, D)
        self.slots = z(B, dt=torch.int64)
        self.seed_key, self.step_idx = z(B, dt=torch.int64), z(B, dt=torch.int64)
        self.cfg = z(B)
        self.t, self.dt, self.active = z(B, N), z(B, N), z(B, N, dt=torch.bool)
        self.positions, self.slot_mapping = z(B, dt=torch.int64), z(B, dt=torch.int64)
        self.block_tables = z(B, max_blocks_per_seq, dt=torch.int64)
        self.context_lens = z(B, dt=torch.int64)
        self.out = z(B, P * D + 1, dt=torch.float32)
        self.host = [HostBuffers(B, N, max_blocks_per_seq, P * D + 1, dev) for _ in range(2)]
        self._turn = 0  # which HostBuffers the next launch uses
        # A capture can happen mid-serving (a new timesteps value): it must not take a launch's turn,
        # or the next launch would refill the buffers of the step still waiting to be collected.
        self.capture_host = HostBuffers(B, N, max_blocks_per_seq, P * D + 1, dev)

        self.buckets = sorted(b for b in buckets if b < max_batch) + [max_batch]
        self.use_graphs = use_cuda_graphs and dev.type == "cuda"
        self.graphs: dict = {}
        self.capture_seconds: dict = {}  # bucket -> seconds (warm-up, which compiles, plus capture)
        self.graph_pool = None
        self._tables: dict = {}
        self.use_triton = False
        if dev.type == "cuda" and attention in ("auto", "triton"):
            from . import triton_attention

            self.use_triton = triton_attention.available()
            if attention == "triton" and not self.use_triton:
                raise RuntimeError("Triton attention requested but triton is unavailable")

    # ------------------------------------------------------------------ the step body
    def _step(self, b: int, n_steps: int, first: int):
        idx = self.slots[:b]
        noise = gaussian_noise(self.seed_key[:b], self.step_idx[:b], (self.D, self.P), self.dtype)
        sched = CfmSchedule.from_tables(self.t[:b], self.dt[:b], self.active[:b], first, n_steps)
        meta = DecodeMetadata(self.slot_mapping[:b], self.block_tables[:b], self.context_lens[:b])
        kv = self.kv
        out = self.model.decode_step(
            self.lm_state[idx], self.res_state[idx], self.prev_state[idx], noise, sched, self.cfg[:b],
            self.positions[:b], PagedAttention(kv.base_k, kv.base_v, meta, self.use_triton),
            PagedAttention(kv.res_k, kv.res_v, meta, self.use_triton))
        self.lm_state[idx] = out.lm_hidden
        self.res_state[idx] = out.residual_hidden
        self.prev_state[idx] = out.patch
        self.out[:b, :-1] = out.patch.reshape(b, -1).float()
        self.out[:b, -1] = out.stop.float()

    # ------------------------------------------------------------------ host side
    def write_state(self, slot: int, lm_hidden, res_hidden, prev_patch):
        """A newly prefilled request's step inputs."""
        self.lm_state[slot] = lm_hidden
        self.res_state[slot] = res_hidden
        self.prev_state[slot] = prev_patch

    def bucket(self, b: int) -> int:
        if not self.use_graphs:
            return b
        return next(x for x in self.buckets if x >= b)

    def _take_host_buffers(self) -> HostBuffers:
        h = self.host[self._turn]
        self._turn ^= 1
        if h.free is not None:
            h.free.synchronize()  # the step before last has copied its inputs in and its result out
        return h

    def _fill(self, h: HostBuffers, rows: list, bucket: int, n_steps: int):
        """rows: (slot, seed_key, step, position, slot_mapping, context_len, block_table, cfg, timesteps)."""
        hr, hb, ht, hc = h.rows, h.blocks, h.tables, h.cfg
        hr[:bucket] = 0
        hr[:bucket, 0] = self.spare_slot
        hr[:bucket, 5] = 1  # padding rows: one scratch token of context
        hb[:bucket] = PagedKVCache.SCRATCH_BLOCK
        ht[:, :bucket] = 0
        hc[:bucket] = 1.0
        if rows:
            hr[:len(rows), :6] = torch.tensor([r[:6] for r in rows], dtype=torch.int64)
            hc[:len(rows)] = torch.tensor([r[7] for r in rows], dtype=torch.float32)
        by_steps: dict = {}
        for i, r in enumerate(rows):
            hb[i, :len(r[6])] = torch.tensor(r[6])
            by_steps.setdefault(r[8], []).append(i)
        for k, idx in by_steps.items():  # rows with the same step count share one table
            ht[:, idx, :n_steps] = self._row_tables(k, n_steps)[:, None, :]
        dev_rows = hr[:bucket].to(self.device, non_blocking=True)
        self.slots[:bucket], self.seed_key[:bucket], self.step_idx[:bucket] = dev_rows[:, 0], dev_rows[:, 1], dev_rows[:, 2]
        self.positions[:bucket], self.slot_mapping[:bucket] = dev_rows[:, 3], dev_rows[:, 4]
        self.context_lens[:bucket] = dev_rows[:, 5]
        self.block_tables[:bucket] = hb[:bucket].to(self.device, non_blocking=True)
        self.cfg[:bucket] = hc[:bucket].to(self.device, self.dtype, non_blocking=True)
        tables = ht[:, :bucket].to(self.device, non_blocking=True)
        self.t[:bucket], self.dt[:bucket] = tables[0].to(self.dtype), tables[1].to(self.dtype)
        self.active[:bucket] = tables[2] > 0

    def _row_tables(self, k: int, n_steps: int) -> torch.Tensor:
        """[3, n_steps] (t, dt, active) of a k-step row, cached: built once per (k, n_steps).
        Computed in the model dtype, as the offline path does; exact in the fp32 staging."""
        key = (k, n_steps)
        if key not in self._tables:
            t, dt, act = row_tables(k, n_steps, self.dtype)
            self._tables[key] = torch.stack([t.float(), dt.float(), act.float()])
        return self._tables[key]

    def launch(self, rows: list, bucket: int | None = None) -> LaunchedStep:
        """Start one step for `rows`; returns without waiting for the GPU.

        bucket: run this many rows (padding the rest); default: the smallest captured bucket
        that fits (graphs) or exactly len(rows) (eager). At most two launched steps may be
        uncollected at a time (the host buffers take turns)."""
        b = len(rows)
        n_steps = max(r[-1] for r in rows)
        first = min(zero_velocity_steps(r[-1]) for r in rows)
        bucket = bucket or self.bucket(b)
        graph = self._graph(bucket, n_steps, first) if self.use_graphs else None
        h = self._take_host_buffers()
        self._fill(h, rows, bucket, n_steps)
        if graph is not None:
            graph.replay()
        else:
            self._step(bucket, n_steps, first)
        h.out[:b].copy_(self.out[:b], non_blocking=True)  # the step's one device-to-host transfer
        if h.free is not None:
            h.free.record()
        return LaunchedStep(b, h.out[:b], h.free)

    def collect(self, step: LaunchedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for a launched step -> (patches [b, P, D] fp32 CPU, stop flags [b] bool CPU)."""
        if step.done is not None:
            step.done.synchronize()
        out = step.out
        return out[:, :-1].reshape(step.rows, self.P, self.D).clone(), out[:, -1] > 0.5

    def run(self, rows: list, bucket: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One step, waited for: `launch` then `collect`."""
        return self.collect(self.launch(rows, bucket))

    # ------------------------------------------------------------------ CUDA graphs
    def _graph(self, bucket: int, n_steps: int, first: int):
        key = (bucket, n_steps, first)
        if key not in self.graphs:
            t0 = time.monotonic()
            self.graphs[key] = self._capture(bucket, n_steps, first)
            self.capture_seconds[bucket] = round(time.monotonic() - t0, 2)
        return self.graphs[key]

    def capture_all(self, n_steps: int = 10):
        """Capture the default-timesteps graph of every bucket (at start-up)."""
        t0 = time.monotonic()
        for b in self.buckets:
            self._graph(b, n_steps, zero_velocity_steps(n_steps))
        ok = sum(g is not None for g in self.graphs.values())
        log.warning("captured %d/%d decode-step graphs in %.1f s", ok, len(self.graphs), time.monotonic() - t0)

    def _capture(self, bucket: int, n_steps: int, first: int):
        """Capture with every row pointing at the spare slot and scratch KV, so warm-up runs
        touch no live request. Returns None (eager for this key) if capture fails."""
        try:
            self._fill(self.capture_host, [], bucket, n_steps)
            self.t[:bucket], self.dt[:bucket] = 0.5, 0.1  # plausible times for the warm-up
            graph = capture_graph(lambda: self._step(bucket, n_steps, first), self.device, self.graph_pool,
                                  warm_up=2)
            self.graph_pool = graph.pool()
            return graph
        except Exception as e:  # noqa: BLE001 - any capture failure falls back to eager
            log.warning("CUDA graph capture failed for batch %d, %d timesteps (%s); running eagerly", bucket,
                        n_steps, e)
            torch.cuda.synchronize(self.device)
            return None
