"""One decode step for the running batch: eagerly, or replayed as a CUDA graph per (batch bucket, loop bucket).

The step body is the same either way. It reads and writes only persistent
buffers, so a captured graph stays valid:

    per slot (one per running request):  lm_state, res_state, prev_state
    per row (the step's batch):          slot, seed key, step index, CFG, Euler tables,
                                         KV position, slot mapping, block table, context length,
                                         LoRA slot (with adapters: 0 is the base model)
    out:                                 patch + stop flag, one [rows, P*D + 1] fp32 buffer

Inside: gather the rows' state -> noise from (seed, step) -> LocDiT CFM over all
timesteps -> LocEnc -> stop head -> base LM step -> FSQ -> residual LM step ->
scatter state back. The host fills the row buffers, replays, and reads one
buffer back: the step's only device-to-host transfer. Padding rows (a batch of
5 runs in the bucket of 8) point at a spare slot and the scratch KV block.

The CFM loop runs a fixed number of Euler steps per graph: a row with k timesteps runs in
the smallest loop bucket >= k, its steps past k inactive (dt = 0, masked out), so its result
equals a run of exactly k steps. Every (batch bucket, loop bucket) graph is captured at
start-up (`capture_all`); serving never captures, whatever timesteps clients ask for.

`launch` returns before the GPU is done, so the engine prepares and launches
step N+1 while step N runs, and reads step N's result (`collect`) after that:
the GPU never waits for the host's bookkeeping. Each launch takes its own set of
pinned host buffers from a free list that `collect` refills, so any number of launches
may be uncollected (the engine launches one step per loop bucket it runs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..checks import TIMESTEPS_RANGE
from ..gpu.buckets import smallest_at_least
from ..gpu.cuda_graph import capture_graph
from ..model.local_modules import CfmSchedule, row_tables, zero_velocity_steps
from ..model.lora import LoraBatch, LoraTables
from ..model.noise import gaussian_noise
from .attention import DecodeMetadata, PagedAttention
from .kv_cache import PagedKVCache

log = logging.getLogger("voxcpm_triton.engine")

# Batch sizes with a decode graph each (the engine's max_num_seqs is always one); a step of b
# rows runs in the smallest >= b, padded. The bucket of 1 costs a graph that torch.compile
# specialises to that size (a longer start-up), and saves a lone request the padding row.
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)

# CFM loop lengths (Euler steps) the graphs are captured for. The default of 10 timesteps is
# exact; the last must be the largest timesteps a request may ask for.
DEFAULT_TIMESTEP_BUCKETS = (4, 8, 10, 12, 16, 24, 32, 50, 100)


def _sorted_positive(name: str, buckets) -> tuple:
    try:
        b = tuple(buckets)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of integers, got {buckets!r}") from None
    if not b or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in b):
        raise ValueError(f"{name} must be positive integers, got {buckets!r}")
    if any(x >= y for x, y in zip(b, b[1:])):
        raise ValueError(f"{name} must be sorted and unique, got {buckets!r}")
    return b


def check_batch_buckets(buckets) -> tuple:
    """Validate a batch-bucket list -> it as a tuple; ValueError naming `batch_buckets` if bad."""
    return _sorted_positive("batch_buckets", buckets)


def check_timestep_buckets(buckets) -> tuple:
    """Validate a loop-bucket list -> it as a tuple; ValueError naming `timestep_buckets` if bad."""
    b = _sorted_positive("timestep_buckets", buckets)
    if b[-1] != TIMESTEPS_RANGE[1]:
        raise ValueError(f"timestep_buckets must end at the largest inference_timesteps allowed "
                         f"({TIMESTEPS_RANGE[1]}), got {buckets!r}")
    return b


class HostBuffers:
    """Pinned host side of one step: its row inputs and its result. `free` is recorded after the
    step's copies; once it has passed, the buffers are safe to refill."""

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
    host: HostBuffers | None = None  # back to the free list when collected
    bucket: int = 0  # rows run (padding included)
    loop: int = 0  # CFM loop length run (the loop bucket)
    # The GPU stream had no work left when this launch queued its first (always False on the CPU).
    stream_idle: bool = False


class DecodeStepRunner:
    def __init__(self, model, kv: PagedKVCache, max_batch: int, max_blocks_per_seq: int, dtype, device,
                 use_cuda_graphs: bool, buckets=DEFAULT_BUCKETS, attention: str = "torch",
                 timestep_buckets=DEFAULT_TIMESTEP_BUCKETS, lora: LoraTables | None = None,
                 plain_graphs: bool = False):
        """lora: the adapters' slot tables; each row then runs on its LoRA slot (the graphs index
        the tables through a per-row buffer, so adapters written later need no new capture).
        plain_graphs: with tables, also capture the plain network's graphs, for steps that need no
        LoRA op (`launch(plain=True)`: base rows only, or one adapter merged into the weights)."""
        self.model, self.kv, self.dtype, self.device = model, kv, dtype, torch.device(device)
        # Compiled with the model: one kernel, where eagerly the hash is some hundred tiny integer ops
        # a step; integer math and the same float64 functions, so the same noise to the bit.
        self.noise = torch.compile(gaussian_noise, dynamic=True) if getattr(model, "compiled", False) \
            else gaussian_noise
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
        self.cfg = z(B, dt=torch.float32)  # fp32 whatever the model dtype: the exact guidance scale
        self.t, self.dt, self.active = z(B, N), z(B, N), z(B, N, dt=torch.bool)
        self.positions, self.slot_mapping = z(B, dt=torch.int64), z(B, dt=torch.int64)
        self.block_tables = z(B, max_blocks_per_seq, dt=torch.int64)
        self.context_lens = z(B, dt=torch.int64)
        self.lora = lora
        self.lora_slots = z(B, dt=torch.int64)  # padding rows: 0, the base model
        self.out = z(B, P * D + 1, dt=torch.float32)
        self._new_host = lambda: HostBuffers(B, N, max_blocks_per_seq, P * D + 1, dev)  # noqa: E731
        self.host = [self._new_host() for _ in range(2)]  # every set made; grows with uncollected launches
        self._host_free = list(self.host)
        self.capture_host = self._new_host()

        self.buckets = sorted(b for b in check_batch_buckets(buckets) if b < max_batch) + [max_batch]
        self.loop_buckets = check_timestep_buckets(timestep_buckets)
        # A loop bucket's graph skips the zero-velocity steps of the fewest timesteps it serves; rows
        # with more zero-velocity steps have them masked out (`active`).
        self.loop_first = {loop: zero_velocity_steps(lo + 1)
                           for lo, loop in zip((0,) + self.loop_buckets[:-1], self.loop_buckets)}
        self.use_graphs = use_cuda_graphs and dev.type == "cuda"
        self.graphs: dict = {}  # (batch bucket, loop bucket) -> graph (None: capture failed, eager)
        # the same keys, without LoRA ops (only with tables: without, `graphs` are the plain ones)
        self.plain_graphs: dict | None = {} if plain_graphs and lora is not None else None
        self.captures = 0  # capture attempts: only `capture_all` makes them
        self.capture_seconds: dict = {}  # batch bucket -> seconds for all its loop buckets (warm-up + capture)
        self.capture_summary = {"graphs": 0, "seconds": 0.0}
        self._warned: set = set()  # keys already warned about running eagerly
        self.graph_pool = None
        self._tables: dict = {}
        # The Triton kernels come as a pair: paged decode attention (here) and LocDiT/LocEnc attention
        # (the model's, chosen when it was built): `attention` is the model's choice ("triton" | "torch").
        if attention not in ("triton", "torch"):
            raise ValueError(f"attention must be 'triton' or 'torch' (the model's), got {attention!r}")
        self.use_triton = attention == "triton"

    # ------------------------------------------------------------------ the step body
    def _step(self, b: int, n_steps: int, first: int, plain: bool = False):
        idx = self.slots[:b]
        noise = self.noise(self.seed_key[:b], self.step_idx[:b], (self.D, self.P), self.dtype)
        sched = CfmSchedule.from_tables(self.t[:b], self.dt[:b], self.active[:b], first, n_steps)
        meta = DecodeMetadata(self.slot_mapping[:b], self.block_tables[:b], self.context_lens[:b])
        kv = self.kv
        lora = None if self.lora is None or plain else LoraBatch(self.lora, self.lora_slots[:b])
        out = self.model.decode_step(
            self.lm_state[idx], self.res_state[idx], self.prev_state[idx], noise, sched, self.cfg[:b],
            self.positions[:b], PagedAttention(kv.base_k, kv.base_v, meta, self.use_triton),
            PagedAttention(kv.res_k, kv.res_v, meta, self.use_triton), lora=lora)
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
        """Rows a launch of b rows runs: its batch bucket with graphs, else exactly b."""
        return self.batch_bucket(b) if self.use_graphs else b

    def batch_bucket(self, b: int) -> int:
        return smallest_at_least(self.buckets, b)

    def loop_bucket(self, timesteps: int) -> int:
        """The CFM loop length a row of `timesteps` Euler steps runs in."""
        loop = smallest_at_least(self.loop_buckets, timesteps)
        if loop is not None:
            return loop
        raise ValueError(f"inference_timesteps {timesteps} is beyond the largest loop bucket {self.loop_buckets[-1]}")

    def graph_key(self, b: int, timesteps: int) -> tuple[int, int]:
        """The graph a launch of b rows, the largest asking for `timesteps`, replays."""
        return self.batch_bucket(b), self.loop_bucket(timesteps)

    def graph_keys(self) -> frozenset:
        """Every graph key: what `capture_all` captures, and all that a launch can need."""
        return frozenset((b, loop) for b in self.buckets for loop in self.loop_buckets)

    def _take_host_buffers(self) -> HostBuffers:
        """A set no uncollected launch uses: from the free list, or a new one."""
        if self._host_free:
            return self._host_free.pop()
        h = self._new_host()
        self.host.append(h)
        return h

    def _fill(self, h: HostBuffers, rows: list, bucket: int, n_steps: int) -> bool:
        """rows: (slot, seed_key, step, position, slot_mapping, context_len, block_table, cfg, timesteps[,
        lora_slot]): the LoRA slot is 0 (the base model) when left out. -> whether the GPU stream
        had no work left when the first copy was queued (`LaunchedStep.stream_idle`)."""
        hr, hb, ht, hc = h.rows, h.blocks, h.tables, h.cfg
        hr[:bucket] = 0
        hr[:bucket, 0] = self.spare_slot
        hr[:bucket, 5] = 1  # padding rows: one scratch token of context
        hb[:bucket] = PagedKVCache.SCRATCH_BLOCK
        ht[:, :bucket] = 0
        hc[:bucket] = 1.0
        if rows:
            hr[:len(rows), :6] = torch.tensor([r[:6] for r in rows], dtype=torch.int64)
            if self.lora is not None:
                hr[:len(rows), 6] = torch.tensor([r[9] if len(r) > 9 else 0 for r in rows], dtype=torch.int64)
            hc[:len(rows)] = torch.tensor([r[7] for r in rows], dtype=torch.float32)
        by_steps: dict = {}
        blocks = hb.numpy()  # per row in numpy, not a torch op each (engine._host_rows)
        for i, r in enumerate(rows):
            blocks[i, :len(r[6])] = r[6]
            by_steps.setdefault(r[8], []).append(i)
        for k, idx in by_steps.items():  # rows with the same step count share one table
            ht[:, idx, :n_steps] = self._row_tables(k, n_steps)[:, None, :]
        idle = self.device.type == "cuda" and torch.cuda.current_stream(self.device).query()
        dev_rows = hr[:bucket].to(self.device, non_blocking=True)
        self.slots[:bucket], self.seed_key[:bucket], self.step_idx[:bucket] = dev_rows[:, 0], dev_rows[:, 1], dev_rows[:, 2]
        self.positions[:bucket], self.slot_mapping[:bucket] = dev_rows[:, 3], dev_rows[:, 4]
        self.context_lens[:bucket] = dev_rows[:, 5]
        if self.lora is not None:
            self.lora_slots[:bucket] = dev_rows[:, 6]
        self.block_tables[:bucket] = hb[:bucket].to(self.device, non_blocking=True)
        self.cfg[:bucket] = hc[:bucket].to(self.device, non_blocking=True)
        tables = ht[:, :bucket].to(self.device, non_blocking=True)
        self.t[:bucket], self.dt[:bucket] = tables[0].to(self.dtype), tables[1].to(self.dtype)
        self.active[:bucket] = tables[2] > 0
        return idle

    def _row_tables(self, k: int, n_steps: int) -> torch.Tensor:
        """[3, n_steps] (t, dt, active) of a k-step row, cached: built once per (k, n_steps).
        Computed in the model dtype, as the offline path does; exact in the fp32 staging."""
        key = (k, n_steps)
        if key not in self._tables:
            t, dt, act = row_tables(k, n_steps, self.dtype)
            self._tables[key] = torch.stack([t.float(), dt.float(), act.float()])
        return self._tables[key]

    def launch(self, rows: list, bucket: int | None = None, plain: bool = False) -> LaunchedStep:
        """Start one step for `rows`; returns without waiting for the GPU. Every launch must be
        collected (that frees its host buffers); any number may be uncollected at a time.

        bucket: run this many rows (padding the rest); default: the smallest captured bucket
        that fits (graphs) or exactly len(rows) (eager). The CFM loop runs the loop bucket of the
        rows' largest timesteps: rows should share a loop bucket (the engine groups them), or the
        others pay for the widest.

        plain: run the network without its LoRA ops (the rows' LoRA slots are ignored): for rows on
        the base model only, or on the one adapter merged into the weights (`model.lora_merge`)."""
        b = len(rows)
        if plain and self.lora is not None and self.use_graphs and self.plain_graphs is None:
            raise ValueError("plain launch: this runner has LoRA tables and no plain graphs (plain_graphs)")
        loop = self.loop_bucket(max(r[8] for r in rows))
        first = min(self.loop_first[loop], *(zero_velocity_steps(r[8]) for r in rows))
        bucket = bucket or self.bucket(b)
        graph = None
        if self.use_graphs:
            # A mix of loop buckets can need a velocity step before the graph's first: eager then.
            graph = (self._graph(bucket, loop, plain) if first == self.loop_first[loop]
                     else self._no_graph((bucket, loop)))
        h = self._take_host_buffers()
        # A launch that raises drops its buffers, not back to the free list: a copy from them may be queued.
        idle = self._fill(h, rows, bucket, loop)
        if graph is not None:
            graph.replay()
        else:
            self._step(bucket, loop, first, plain)
        h.out[:b].copy_(self.out[:b], non_blocking=True)  # the step's one device-to-host transfer
        if h.free is not None:
            h.free.record()
        return LaunchedStep(b, h.out[:b], h.free, h, bucket, loop, idle)

    def collect(self, step: LaunchedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for a launched step -> (patches [b, P, D] fp32 CPU, stop flags [b] bool CPU), copies:
        the engine keeps views of them (`engine._host_rows`) after the host buffers are refilled."""
        if step.done is not None:
            step.done.synchronize()
        out = step.out
        result = out[:, :-1].reshape(step.rows, self.P, self.D).clone(), out[:, -1] > 0.5
        if step.host is not None:  # copied out above: the buffers may be refilled
            self._host_free.append(step.host)
            step.host = None
        return result

    # ------------------------------------------------------------------ CUDA graphs
    def _graph(self, bucket: int, loop: int, plain: bool = False):
        """The graph of a key, or None (eager). Never captures: a capture while serving would stall
        every request and grow GPU memory with each new key."""
        key = (bucket, loop)
        graphs = self.plain_graphs if plain and self.plain_graphs is not None else self.graphs
        if key not in graphs:
            return self._no_graph(key)
        return graphs[key]

    def _no_graph(self, key):
        if key not in self._warned:
            self._warned.add(key)
            log.warning("no decode-step graph for batch bucket %d, loop bucket %d; running it eagerly", *key)
        return None

    def capture_all(self):
        """Capture the graph of every (batch bucket, loop bucket) (at start-up), and its plain twin."""
        t0 = time.monotonic()
        sets = [(self.graphs, False)] + ([(self.plain_graphs, True)] if self.plain_graphs is not None else [])
        for b in self.buckets:
            tb = time.monotonic()
            for graphs, plain in sets:
                for i, loop in enumerate(self.loop_buckets):
                    if (b, loop) not in graphs:
                        # Loop lengths change no shapes: once the batch bucket's first graph has warmed up
                        # (compiled, autotuned), one eager run before each further capture is enough.
                        graphs[(b, loop)] = self._capture(b, loop, self.loop_first[loop],
                                                          warm_up=2 if i == 0 else 1, plain=plain)
            self.capture_seconds[b] = round(time.monotonic() - tb, 2)
        seconds = time.monotonic() - t0
        every = [g for graphs, _ in sets for g in graphs.values()]
        ok = sum(g is not None for g in every)
        self.capture_summary = {"graphs": ok, "seconds": round(seconds, 2)}
        log.warning("captured %d/%d decode-step graphs (%d batch x %d loop buckets%s) in %.1f s", ok,
                    len(every), len(self.buckets), len(self.loop_buckets),
                    ", with and without LoRA ops" if len(sets) > 1 else "", seconds)

    def _capture(self, bucket: int, n_steps: int, first: int, warm_up: int = 2, plain: bool = False):
        """Capture with every row pointing at the spare slot and scratch KV, so warm-up runs
        touch no live request. Returns None (eager for this key) if capture fails."""
        self.captures += 1
        try:
            self._fill(self.capture_host, [], bucket, n_steps)
            self.t[:bucket], self.dt[:bucket] = 0.5, 0.1  # plausible times for the warm-up
            graph = capture_graph(lambda: self._step(bucket, n_steps, first, plain), self.device, self.graph_pool,
                                  warm_up=warm_up)
            self.graph_pool = graph.pool()
            return graph
        except Exception as e:  # noqa: BLE001 - any capture failure falls back to eager
            log.warning("CUDA graph capture failed for batch %d, loop bucket %d (%s); running eagerly", bucket,
                        n_steps, e)
            torch.cuda.synchronize(self.device)
            return None
