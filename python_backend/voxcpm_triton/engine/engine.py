"""The decoder engine: continuous batching of VoxCPM2 requests over a paged KV cache.

One background thread owns the model and the cache. Callers only `submit`, `cancel` (or
`cancel_all`), add, remove and list LoRA adapters, read `stats` and `status`, and `shutdown`;
everything else happens in the thread, at step boundaries:

    take new requests and cancels  ->  admit waiting requests (FIFO, by free blocks)
    ->  prefill the admitted ones together (each after the longest prefix of its prompt already
        in the prefix cache)  ->  launch one decode step for everyone running
        (one runner launch per CFM loop bucket, so a request's timesteps cost only its group)
    ->  read the previous step's result: hand out patches on the chunk schedule,
        finish and free who is done

All GPU work goes to one stream, so reading step N after launching step N+1
keeps the GPU busy while the host does its bookkeeping, and stream order makes
reusing a finished request's slot and blocks safe.

Every policy decision on requests (admission, cancels, who joins a step, chunking, finishing, slots
and blocks) is the `Scheduler`'s (scheduler.py, no torch); this class runs the model and the thread.
Two choices about how a step runs are made beside it: which prompts prefill together in one packed
graph (`prefill_packs`) and when a step's adapter runs merged into the weights (`lora_merging`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .. import checks, timeline
from ..checks import default_max_len
from ..gpu.cuda_graph import capture_graph
from ..gpu.host_copies import to_device
from ..model import split_k
from ..model.lora import LoraBatch
from ..model.lora_merge import MergedWeights
from ..model.noise import request_key
from .attention import PagedAttention, PrefillMetadata, PrefillRowsMetadata
from .kv_cache import PagedKVCache
from .lora_merging import LoraMerging
from .loras import EngineLoras
from .prefill_packs import PACK_BUCKETS, PackedPrefillGraphs
from .prefill_runner import PrefillGraphs
from .request import (EngineRequest, Event, Finished, LatentChunk, RequestError, RequestHandle, RequestState,
                      prompt_block_hashes, resolve_seed)
from .scheduler import Scheduler
from .step_runner import (DEFAULT_BUCKETS, DEFAULT_TIMESTEP_BUCKETS, DecodeStepRunner, check_batch_buckets,
                          check_timestep_buckets)

log = logging.getLogger("voxcpm_triton.engine")

# The longest the engine holds its next launch for first chunks' audio to be launched: the audio
# thread may be finishing a round first; past this the step goes ahead.
FIRST_AUDIO_WAIT_S = 0.02


@dataclass
class EngineConfig:
    """The engine's settings; these defaults suit an engine in process (tests, `VoxCPM2`, the
    benchmarks). The served decoder sets each from its parameters (decoder/config.pbtxt)."""
    block_size: int = 16
    num_blocks: int | None = None  # explicit pool size; else from kv_memory_bytes
    kv_memory_bytes: int | None = None  # default: 256 MiB on CPU, 25% of free GPU memory
    max_num_seqs: int = 32
    chunk_schedule: tuple = (1, 2, 4, 8)  # patches per chunk; the last repeats
    idle_wait_s: float = 0.05
    cuda_graphs: bool = True  # one graph per (batch bucket, loop bucket) on a GPU; eager on the CPU
    # The attention kernels and torch.compile are the VoxCPM2's (`VoxCPM2.from_pretrained(attention=,
    # compile=)`): the engine follows what its model was built with.
    prefill_graphs: bool = True  # a lone prompt's prefill as a CUDA graph per length bucket (GPU with graphs)
    # With prefill_graphs and the Triton attention: prompts admitted together prefill as one CUDA
    # graph per total-length bucket (`prefill_packs`), not as one eager packed call.
    prefill_pack_graphs: bool = True
    prefill_pack_buckets: tuple = PACK_BUCKETS  # their total new positions; a longer pack is split
    # A prefill that replays a graph is queued behind the step in flight at once (that step's
    # patches are read after the next launch, as every step's); False: the step is handed out first,
    # as for an eager prefill (an A/B switch for benchmarks/closed_loop.py).
    graph_prefill_behind_step: bool = True
    # CFM loop lengths: a request with k timesteps runs in the smallest >= k (exactly, padded steps
    # masked); all are captured at start-up. Sorted, unique, ending at the largest timesteps allowed.
    timestep_buckets: tuple = DEFAULT_TIMESTEP_BUCKETS
    # Batch sizes with a decode graph each (those below max_num_seqs; it always has one): a step
    # of b rows runs in the smallest >= b, padded. Sorted, unique, positive.
    batch_buckets: tuple = DEFAULT_BUCKETS
    max_waiting: int | None = None  # requests queued for admission; one more is refused as busy (None: no bound)
    # Requests whose prompts start alike (a voice, a reference) share the K/V blocks of that prefix
    # and prefill only the rest; idle cached blocks are evicted, least recently used first, when needed.
    enable_prefix_caching: bool = True
    # A request whose client has less audio than this left (played from its first chunk on) gets
    # its pending patches, as the largest schedule size they fill (all once it ran dry), before its
    # chunk fills (0: chunks only by the schedule).
    playback_margin_s: float = 0.0
    # With LoRA adapters: a step whose rows all run on one adapter (or none) runs the plain network,
    # that adapter merged into the weights (model.lora_merge), instead of a LoRA op per projection.
    # Costs a copy of the adapted weights and a second set of decode graphs (captured at start-up).
    lora_merge: bool = True

    def __post_init__(self):
        self.timestep_buckets = check_timestep_buckets(self.timestep_buckets)
        self.batch_buckets = check_batch_buckets(self.batch_buckets)


class EngineShutdown(RuntimeError):
    pass


class Engine:
    def __init__(self, vox, config: EngineConfig | None = None,
                 fault_hook: Callable[[RequestState, str], None] | None = None,
                 first_audio: Any = None):
        """vox: a loaded `VoxCPM2`, used as built (the paged decode attention follows `vox.attention`;
        a compiled vox compiles on its first calls here). With `lora_merge` its weights hold an adapter
        while requests on it run, and are as loaded again once none is left and when the engine thread
        ends: do not run vox's offline API meanwhile. fault_hook(state,
        stage) is called per request at each stage ('prefill', and 'step' before each step's
        launch); whatever it raises fails that request only (tests use it). first_audio: where the
        sinks decode audio, with `mark()` and `fence(mark, timeout) -> (launched, event)`
        (`StreamAudio`); with it, a step whose first chunks go first (`Scheduler.first_audio_first`)
        is handed out before the next step is launched (a newcomer's graph prefill may be queued
        first), and the GPU work after it waits for the event the fence returns: a client's first
        audio does not queue behind the next step."""
        self.vox, self.model = vox, vox.model
        self.cfg = config or EngineConfig()
        self.device, self.dtype = vox.device, vox.dtype
        self.fault_hook = fault_hook
        self.first_audio = first_audio
        lm, res = vox.cfg.lm_config, vox.cfg.residual_lm()
        # Before the KV cache takes its share of the free memory: the copies of the adapted weights.
        self.merged = self._merged_weights() if vox.loras is not None and self.cfg.lora_merge else None
        assert (lm.num_key_value_heads, lm.head_dim) == (res.num_key_value_heads, res.head_dim)
        per_block = PagedKVCache.bytes_per_block(lm.num_hidden_layers, res.num_hidden_layers,
                                                 lm.num_key_value_heads, lm.head_dim, self.cfg.block_size, self.dtype)
        n_blocks = self.cfg.num_blocks or max(1, self._kv_budget() // per_block)
        self.kv = PagedKVCache(lm.num_hidden_layers, res.num_hidden_layers, lm.num_key_value_heads, lm.head_dim,
                               n_blocks, self.cfg.block_size, self.dtype, self.device)
        self.max_positions = vox.cfg.max_length
        self.max_blocks_per_seq = math.ceil(self.max_positions / self.cfg.block_size)
        self.prefill_graphs: PrefillGraphs | None = None  # GPU: lone prompts replay a graph
        self.pack_graphs: PackedPrefillGraphs | None = None  # GPU: prompts admitted together replay one
        self.startup_s: dict = {}  # GPU: seconds of each start-up phase (compile + capture)
        self.runner = DecodeStepRunner(self.model, self.kv, self.cfg.max_num_seqs, self.max_blocks_per_seq,
                                       self.dtype, self.device, self.cfg.cuda_graphs, attention=vox.attention,
                                       buckets=self.cfg.batch_buckets, timestep_buckets=self.cfg.timestep_buckets,
                                       lora=vox.loras.tables if vox.loras is not None else None,
                                       plain_graphs=self.merged is not None)
        self.lora_merging = LoraMerging(self.merged, self.runner.lora is not None)
        if self.runner.use_graphs:
            with self._torch_settings():
                self._prepare_gpu()
        self.capture_summary = dict(self.runner.capture_summary)  # decode graphs captured at start-up, seconds
        self.scheduler = Scheduler(self.kv.allocator, self.cfg.block_size, self.cfg.max_num_seqs,
                                   self.cfg.chunk_schedule, self.runner.loop_bucket, self.cfg.max_waiting,
                                   self.cfg.playback_margin_s, vox.patch_seconds)

        self._lock = threading.Condition()
        # LoRA adapters (`vox.loras`): rows of a step run on their own; added and removed while serving.
        self.loras = EngineLoras(vox.loras, self._lock) if vox.loras is not None else None
        self._inbox: deque = deque()  # submitted, not yet handed to the scheduler (the thread does that)
        self._cancels: dict = {}  # request id -> the error it ends with (None: a plain cancel)
        self._ids: set = set()  # ids submitted and not yet finished
        self._in_flight: list = []  # (batch, LaunchedStep) per launch of the decode step not read yet
        # steps: engine iterations that launched; launches: runner launches (one per loop bucket
        # run, and isolation reruns); batch_sizes: rows per launch
        # first_audio_fences: steps read before the next launch whose first chunks' decode was launched
        # before it; first_audio_fence_misses: such steps whose decode was not (busy, or past the wait)
        # late_launches: steps launched while another was in flight (launched ahead of its read) whose first
        # launch found the engine's stream idle: the GPU ran out of the engine's work, waiting for this thread
        self._batch_failures_said: dict[str, float] = {}  # what -> when it was last logged (_batch_failed)
        self._stats = {"steps": 0, "launches": 0, "finished": 0, "batch_sizes": Counter(), "steps_per_s": 0.0,
                       "first_audio_fences": 0, "first_audio_fence_misses": 0, "late_launches": 0}
        self._stop = False
        self.heartbeat = time.monotonic()  # the loop's last iteration (it wakes every idle_wait_s)
        self.failure: str | None = None  # why the loop ended, if it did not end by shutdown()
        self._thread = threading.Thread(target=self._loop, name="voxcpm-engine", daemon=True)
        self._thread.start()

    def _merged_weights(self) -> MergedWeights | None:
        try:
            merged = MergedWeights(self.model, self.vox.loras.tables)
        except ValueError as e:  # FP8 weights: per-row LoRA ops only
            log.warning("LoRA: adapters are not merged into the weights: %s", e)
            return None
        log.warning("LoRA: steps on a single adapter run it merged (a copy of %d adapted weights, %.0f MiB)",
                    len(merged.sites), merged.nbytes() / 2**20)
        return merged

    def _torch_settings(self) -> contextlib.ExitStack:
        """The torch settings the engine's GPU work runs under, scoped to its start-up and to its
        thread's loop (entered there) and restored after, rather than switched process-wide.
        - SDPA without cuDNN: flash attention beats cuDNN's on LocDiT's 11-token sequences
          (benchmarks/attention_shapes.py); the choice is baked in at capture, and the loop's eager
          prefills use it too. With CUDA graphs only: eager GPU engines keep torch's default.
        - dynamo's recompile limit raised (compiled models): never silently eager."""
        stack = contextlib.ExitStack()
        if self.runner.use_graphs:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                             SDPBackend.MATH]))
        if self.vox.compiled:
            import torch._dynamo

            limit = max(torch._dynamo.config.recompile_limit, 32)
            stack.enter_context(torch._dynamo.config.patch(recompile_limit=limit))
        return stack

    @torch.no_grad()  # the engine thread's grad mode: compiled code is guarded on it
    def _prepare_gpu(self):
        """Compile (a compiled vox compiles on its first call here), capture the decode-step graphs,
        compile prefill shapes, capture prefill graphs."""
        t0 = time.monotonic()
        self.runner.capture_all()
        t1 = time.monotonic()
        self._warm_up_prefill()
        t2 = time.monotonic()
        if self.merged is not None:  # slot 0 merges nothing: capturing leaves the weights as loaded
            try:
                self.merged.merge = capture_graph(self.merged.merge_body, self.device, None).replay
            except Exception as e:  # noqa: BLE001 - merges then run eagerly
                log.warning("CUDA graph capture failed for the LoRA merge (%s); merging eagerly", e)
                torch.cuda.synchronize(self.device)
        if self.cfg.prefill_graphs:
            self.prefill_graphs = PrefillGraphs(
                self.model, self.kv, self.device, pool=self.runner.graph_pool, use_triton=self.runner.use_triton,
                max_blocks=self.max_blocks_per_seq if self.cfg.enable_prefix_caching else None, lora=self.runner.lora)
            self.prefill_graphs.capture_all()
            if self.cfg.prefill_pack_graphs and self.runner.use_triton:
                self.pack_graphs = PackedPrefillGraphs(
                    self.model, self.kv, self.device, self.cfg.max_num_seqs, self.max_blocks_per_seq,
                    buckets=self.cfg.prefill_pack_buckets, pool=self.prefill_graphs.pool, lora=self.runner.lora)
                self.pack_graphs.capture_all()
        torch.cuda.synchronize(self.device)
        self.startup_s = {"decode_graphs": t1 - t0, "prefill_warm_up": t2 - t1,
                          "prefill_graphs": time.monotonic() - t2}

    def _kv_budget(self) -> int:
        if self.cfg.kv_memory_bytes:
            return self.cfg.kv_memory_bytes
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.25)
        return 256 << 20

    # ------------------------------------------------------------------ caller side
    def submit(self, request: EngineRequest, sink: Callable[[Event], None] | None = None) -> RequestHandle:
        """Queue a request. Invalid or never-fitting requests raise RequestError here."""
        p = request.prompt
        try:
            capacity = checks.context_room(len(p), self.max_positions, request.min_len)
            max_len = request.max_len if request.max_len is not None else default_max_len(p.n_target_tokens, capacity)
            checks.check_generation(request.min_len, max_len, request.cfg_value, request.inference_timesteps,
                                    capacity=capacity, max_len_default=request.max_len is None)
            seed = checks.check_seed(resolve_seed(request.seed))
            need = self.scheduler.blocks_needed(request.request_id, len(p), max_len)
            lora_slot, salt = self._acquire_lora(request.lora)  # held until the request ends
        except RequestError:
            raise
        except ValueError as e:
            raise RequestError(str(e)) from None
        try:
            # Hashed here, in the caller's thread, not in the engine loop. Whatever else would change
            # the prompt's K/V (an adapter) goes into the salt.
            hashes = prompt_block_hashes(p, self.cfg.block_size, salt=salt) if self.cfg.enable_prefix_caching else []
            handle = RequestHandle(request.request_id)
            state = RequestState(
                req=request, sink=sink or handle.queue.put, max_len=max_len,
                seed_key=request_key(seed), blocks_reserved=need, block_hashes=hashes,
                lora_slot=lora_slot)
            with self._lock:
                if self._stop:
                    raise EngineShutdown("engine is shut down")
                if request.request_id in self._ids:
                    raise RequestError(f"request id {request.request_id!r} is already in flight")
                self.scheduler.check_room(queued_elsewhere=len(self._inbox))
                self._ids.add(request.request_id)
                self._inbox.append(state)
                self._lock.notify()
        except BaseException:
            if lora_slot:
                with self._lock:
                    self.loras.release(lora_slot)
            raise
        return handle

    def _acquire_lora(self, name) -> tuple[int, bytes]:
        """A new request's adapter -> (its slot, the prefix-cache salt); (0, b"") for the base model."""
        if name is None or name == "":
            return 0, b""
        if not isinstance(name, str):
            raise ValueError(f"lora must be an adapter's name (a string), got {type(name).__name__}")
        if self.loras is None:
            raise ValueError(f"lora: LoRA adapter {name!r} requested but this server loads no adapters "
                             "(decoder parameter lora_dir, or VOXCPM_LORA_DIR)")
        try:
            return self.loras.acquire(name)
        except ValueError as e:
            raise ValueError(f"lora: {e}") from None

    # -- LoRA adapters while serving (any thread; the engine thread writes the tables)
    def lora_names(self) -> list:
        return self.loras.names() if self.loras is not None else []

    def add_lora(self, name: str) -> list:
        """Load adapter `name` from the LoRA directory into a free slot (or replace the loaded one)
        -> the names loaded after. No graph is captured again."""
        return self._lora_manager().add(name)

    def remove_lora(self, name: str) -> list:
        """Remove adapter `name` for new requests; the ones running on it finish with it."""
        return self._lora_manager().remove(name)

    def _lora_manager(self) -> EngineLoras:
        if self.loras is None:
            raise ValueError("this server loads no LoRA adapters (decoder parameter lora_dir, or VOXCPM_LORA_DIR)")
        return self.loras

    def cancel(self, request_id: str) -> bool:
        """Cancel a request submitted here and not ended -> whether there was one (else nothing happens)."""
        with self._lock:
            if request_id not in self._ids:
                return False
            self._cancels.setdefault(request_id, None)
            self._lock.notify()
            return True

    def cancel_all(self, error: str) -> int:
        """End every request submitted here with `error` -> how many were not already ending so."""
        with self._lock:
            new = [rid for rid in self._ids if self._cancels.get(rid) != error]
            self._cancels.update(dict.fromkeys(new, error))
            self._lock.notify()
            return len(new)

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def running(self) -> dict:
        return self.scheduler.running

    def in_flight(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._ids)

    def stats(self) -> dict:
        with self._lock:
            s = dict(self._stats)
            s["batch_sizes"] = dict(s["batch_sizes"])
            blocks, sched = self.kv.allocator, self.scheduler
            s.update(running=len(self.running), waiting=len(self.waiting) + len(self._inbox),
                     free_blocks=blocks.free, total_blocks=blocks.total, in_flight_ids=len(self._ids),
                     cached_blocks=blocks.cached, prefix_cache_hits=sched.prefix_hits,
                     prefix_cache_hit_blocks=sched.prefix_hit_blocks, prefix_cache_evictions=blocks.evictions,
                     early_chunks=sched.early_chunks,
                     lora_merges=self.lora_merging.merges)
        return s

    def status(self) -> str | None:
        """None while the engine can serve; else why not (its thread died or is stuck)."""
        if self.failure:
            return self.failure
        if not self._thread.is_alive():
            return "the engine thread has stopped"
        return None

    def shutdown(self, timeout: float = 30.0):
        """Stop the thread; in-flight requests end with an error event."""
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ engine thread
    def _loop(self):
        torch.set_grad_enabled(False)
        with self._torch_settings():
            try:
                self._run_loop()
            finally:
                self.lora_merging.unmerge_safely()

    def _run_loop(self):
        t_last, steps_window = time.monotonic(), 0
        try:
            while True:
                self.heartbeat = time.monotonic()
                with self._lock:
                    while not (self._stop or self._inbox or self._cancels or self.running or self.waiting
                                 or self._in_flight or (self.loras is not None and self.loras.pending())):
                        self._lock.wait(self.cfg.idle_wait_s)
                        self.heartbeat = time.monotonic()
                    if self._stop:
                        break
                    for st in self._inbox:
                        self.scheduler.add(st)
                    self._inbox.clear()
                    cancels, self._cancels = self._cancels, {}
                self._apply_cancels(cancels)
                if self.loras is not None:  # adapters added meanwhile: written between steps, on this stream
                    self.loras.apply(before_write=self.lora_merging.unmerge)
                admitted = self._admit()
                if admitted:
                    timeline.event("prefill", len(admitted))
                    self._prefill(admitted)
                    timeline.event("prefilled", len(admitted))
                if (self.running or self._in_flight) and self._decode_step():
                    steps_window += 1
                now = time.monotonic()
                if now - t_last >= 1.0:
                    with self._lock:
                        self._stats["steps_per_s"] = steps_window / (now - t_last)
                    t_last, steps_window = now, 0
        except Exception as e:  # a bug in the loop itself: fail everyone rather than hang them
            log.exception("engine loop crashed")
            self.failure = f"the engine thread crashed: {e}"
            self._fail_all(f"engine failure: {e}")
            return
        self._fail_all("engine shut down")

    def _fail_all(self, message: str):
        if self.loras is not None:
            self.loras.close(message)
        with self._lock:
            self._stop = True
            for st in self._inbox:
                self.scheduler.add(st)
            self._inbox.clear()
        for st in self.scheduler.all_requests():
            self._finish(st, "error", message)

    def _apply_cancels(self, cancels: dict):
        for rid, error in cancels.items():
            st = self.scheduler.cancel(rid)
            if st is not None:
                self._ended(st, "cancelled", error)

    def _admit(self) -> list[RequestState]:  # a method of its own so that tests can break the loop here
        return self.scheduler.admit()

    def _slots(self, st: RequestState, start: int, end: int) -> list[int]:
        bs = self.cfg.block_size
        return [st.block_table[p // bs] * bs + p % bs for p in range(start, end)]

    # -- prefill
    def _prefill(self, states: list[RequestState]):
        ok = []
        for st in states:
            try:
                if self.fault_hook:
                    self.fault_hook(st, "prefill")
                st.prompt_len = len(st.req.prompt)
                self.scheduler.grow_to(st, st.prompt_len)
                ok.append(st)
            except Exception as e:
                self._finish(st, "error", f"prefill failed: {e}")
        by_adapter: dict = {}  # a prefill call runs one adapter (model.lora.LoraBatch, single)
        for st in ok:
            by_adapter.setdefault(st.lora_slot, []).append(st)
        for slot, group in by_adapter.items():
            run = functools.partial(self._run_prefill, lora_slot=self.lora_merging.for_prefill(slot))
            for pack in self._packs(group):
                if not (self._replays_graph(pack) and self.cfg.graph_prefill_behind_step):
                    # An eager prefill is mostly host time spent launching kernels: hand out the step
                    # in flight first, so its patches (a first chunk, maybe) do not wait for it. A
                    # graph's replay is queued behind that step at once: the GPU goes on from it
                    # without waiting for the host to read it, and if the step fills first chunks
                    # (`first_audio`), their decode shares the GPU with this prefill, ahead of the
                    # next step still (benchmarks/results.md, twenty-ninth session).
                    self._hand_out_in_flight()
                for st, _ in self._isolated(pack, run, "prefill"):
                    # Its prefill is launched on the engine's one GPU stream: whatever reads these
                    # blocks later (another request's prefill or step) is queued after their writes.
                    self.scheduler.cache_prompt(st)

    def _replays_graph(self, pack: list[RequestState]) -> bool:  # apart, so that CPU tests can take the graph path
        return self._prefill_graph(pack) is not None

    def _prefill_graph(self, states: list[RequestState]) -> str | None:
        """Which CUDA graph a prefill of `states` replays: 'lone', 'pack', or None (it runs eagerly)."""
        bs, pg, packed = self.cfg.block_size, self.prefill_graphs, self.pack_graphs
        starts = [st.cached_blocks * bs for st in states]
        fresh = [st.prompt_len - c for st, c in zip(states, starts)]  # new positions per prompt
        if len(states) == 1 and pg is not None and pg.fits(states[0].prompt_len, starts[0]):
            return "lone"
        if packed is not None and packed.fits(sum(fresh), len(states), max(fresh)):
            return "pack"
        return None

    def _packs(self, states: list[RequestState]) -> list[list[RequestState]]:
        """`states` split, in order, into packs that each fit one packed prefill graph (all of them
        as one pack without those graphs); a prompt too long for any runs alone (eagerly)."""
        pg = self.pack_graphs
        if pg is None or len(states) == 1:
            return [states]
        bs = self.cfg.block_size
        packs, positions, longest = [[]], 0, 0
        for st in states:
            n = st.prompt_len - st.cached_blocks * bs
            if packs[-1] and not pg.fits(positions + n, len(packs[-1]) + 1, max(longest, n)):
                packs.append([])
                positions = longest = 0
            packs[-1].append(st)
            positions, longest = positions + n, max(longest, n)
        return packs

    def _batch_failed(self, what: str, rows: int, then: str):
        """In an except block: log a batch's failure, with its traceback, even if every rerun passes (a
        batch that only fails whole would go unseen), but at most once a minute for each `what` (one
        that lasts fails every step)."""
        now = time.monotonic()
        if now - self._batch_failures_said.get(what, -math.inf) >= 60.0:
            self._batch_failures_said[what] = now
            log.warning("%s failed for a batch of %d; %s (said at most once a minute)", what, rows, then,
                        exc_info=True)

    def _isolated(self, states: list[RequestState], run, what: str) -> list:
        """run(states) -> one result per state. If the batch raises, each state is rerun alone so
        that only the culprit fails (reruns rewrite the same KV slots). Returns (state, result)
        pairs for the survivors."""
        try:
            return list(zip(states, run(states)))
        except Exception as e:  # noqa: BLE001 - any failure is reported on the request
            if len(states) == 1:
                log.exception("%s failed for %s", what, states[0].request_id)
                self._finish(states[0], "error", f"{what} failed: {e}")
                return []
            self._batch_failed(what, len(states), "rerunning each request alone")
        survivors = []
        for st in states:
            try:
                survivors.append((st, run([st])[0]))
            except Exception as e:  # noqa: BLE001
                log.exception("%s failed for %s", what, st.request_id)
                self._finish(st, "error", f"{what} failed: {e}")
        return survivors

    def _run_prefill(self, states: list[RequestState], lora_slot: int):
        """Prefill each prompt's positions after its cached prefix (all of them without one), with
        the LoRA ops of `lora_slot` (`LoraMerging.for_prefill`)."""
        dev, bs = self.device, self.cfg.block_size
        prompts = [st.req.prompt for st in states]
        starts = [st.cached_blocks * bs for st in states]
        slots = [s for st, c in zip(states, starts) for s in self._slots(st, c, st.prompt_len)]
        graph = self._prefill_graph(states)
        if graph == "lone":
            lm_h, res_h = self.prefill_graphs.run(prompts[0], slots, starts[0], states[0].block_table,
                                                  lora_slot=lora_slot)
        elif graph == "pack":
            tables = [st.block_table[:-(-st.prompt_len // bs)] for st in states]
            lm_h, res_h = self.pack_graphs.run(prompts, starts, slots, tables, lora_slot=lora_slot)
        else:
            seq = [0]
            for p, c in zip(prompts, starts):
                seq.append(seq[-1] + len(p) - c)
            if any(starts) and self.runner.use_triton:
                meta = self._prefill_rows(states, starts, slots)
            else:
                contexts = None
                if any(starts):
                    contexts = [(c, to_device(torch.tensor(st.block_table[:-(-st.prompt_len // bs)]), dev))
                                if c else None
                                for st, c in zip(states, starts)]
                meta = PrefillMetadata(to_device(torch.tensor(slots), dev), seq, contexts)
            positions = to_device(torch.cat([torch.arange(c, len(p)) for p, c in zip(prompts, starts)])[None], dev)
            new = lambda name: to_device(  # noqa: E731
                torch.cat([getattr(p, name)[c:] for p, c in zip(prompts, starts)])[None], dev)
            lm_h, res_h = self.model.prefill(
                new("tokens"), new("text_mask"), new("audio_mask"), new("feats"), positions,
                to_device(torch.tensor(seq[1:]), dev) - 1,
                PagedAttention(self.kv.base_k, self.kv.base_v, meta, self.runner.use_triton),
                PagedAttention(self.kv.res_k, self.kv.res_v, meta, self.runner.use_triton),
                lora=self._prefill_lora(lora_slot))
        for i, st in enumerate(states):
            self.runner.write_state(st.slot, lm_h[i], res_h[i], to_device(st.req.prompt.feats[-1], dev).to(self.dtype))
        return [None] * len(states)

    def _prefill_rows(self, states: list[RequestState], starts: list[int], slots: list[int]) -> PrefillRowsMetadata:
        """A packed prefill after cached prefixes as rows of the paged decode kernel: one launch per
        layer for all prompts, where a loop of per-prompt gathers and masked attentions would cost
        a dozen launches per prompt and layer."""
        bs = self.cfg.block_size
        tables = [st.block_table[:-(-st.prompt_len // bs)] for st in states]
        width = max(map(len, tables))
        rows, ctx = [], []
        for st, c, table in zip(states, starts, tables):
            n = st.prompt_len - c
            rows.extend([table + [PagedKVCache.SCRATCH_BLOCK] * (width - len(table))] * n)
            ctx.extend(range(c + 1, st.prompt_len + 1))
        dev = self.device
        return PrefillRowsMetadata(to_device(torch.tensor(slots), dev),
                                   to_device(torch.tensor(rows, dtype=torch.int64), dev),
                                   to_device(torch.tensor(ctx, dtype=torch.int64), dev))

    def _prefill_lora(self, slot: int) -> LoraBatch | None:
        """A prefill's adapter (all its prompts share it): None without LoRA tables."""
        if self.runner.lora is None:
            return None
        return LoraBatch(self.runner.lora, to_device(torch.tensor([slot]), self.device), single=True)

    # Prompt lengths of the start-up prefills, as fractions of a block: one prompt and packs of two
    # and three, with totals that are and are not a multiple of 16. Triton compiles a kernel again
    # for each new class of its integer arguments (== 1, divisible by 16, other) and torch.compile
    # specializes a size of 1: a first burst of real prompts would otherwise wait for that (~0.5 s).
    WARM_UP_PACKS = ((1.0,), (1.0, 1.0), (0.75,), (1.0, 0.875, 0.6875))

    def _warm_up_prefill(self):
        """Throwaway eager prefills into the scratch block, of the `WARM_UP_PACKS` lengths, so that the
        compiled code and the kernels meet the packed prefill path's shape classes at start-up, not in
        a request's first audio; then a pack past `split_k.MAX_TOKENS` rows (prompts of at most
        `max_positions`), whose row count is a guard of the compiled layers: their unsplit branch
        compiles here, not in the first long prompt's (or eager pack's) prefill."""
        n = self.cfg.block_size
        for pack in self.WARM_UP_PACKS:
            self._throwaway_prefill([max(1, round(f * n)) for f in pack], after_prefix=True)
        whole, rest = divmod(split_k.MAX_TOKENS + 1, self.max_positions)
        self._throwaway_prefill([self.max_positions] * whole + [rest] * (rest > 0), after_prefix=False)

    def _throwaway_prefill(self, lens: list, after_prefix: bool):
        """One packed prefill of prompts of `lens` positions (zeros) whose K/V all go to the scratch
        block's slots (wrapping round it): from position 0, and with `after_prefix` (prompts of at most
        a block) also as after a cached prefix (rows of the paged decode kernel on the GPU)."""
        dev, n = self.device, self.cfg.block_size
        assert not after_prefix or max(lens) <= n, "a cached prefix's rows read one block table entry"
        P, D = self.vox.patch_size, self.vox.feat_dim
        starts = [0]
        for L in lens:
            starts.append(starts[-1] + L)
        S = starts[-1]
        offsets = torch.cat([torch.arange(L, device=dev) for L in lens])
        slots = offsets % n + PagedKVCache.SCRATCH_BLOCK * n
        positions = offsets[None]
        zeros = torch.zeros(1, S, dtype=torch.int64, device=dev)
        metas = [PrefillMetadata(slots, starts)]
        if after_prefix:
            tables = torch.full((S, 1), PagedKVCache.SCRATCH_BLOCK, dtype=torch.int64, device=dev)
            metas.append(PrefillRowsMetadata(slots, tables, offsets + 1))
        for meta in metas:
            self.model.prefill(zeros, zeros + 1, zeros, torch.zeros(1, S, P, D, device=dev), positions,
                               torch.tensor(starts[1:], device=dev) - 1,
                               PagedAttention(self.kv.base_k, self.kv.base_v, meta, self.runner.use_triton),
                               PagedAttention(self.kv.res_k, self.kv.res_v, meta, self.runner.use_triton),
                               lora=self._prefill_lora(0))

    # -- decode: step N+1 is launched before step N's result is read, so the GPU does not wait
    # for the host's bookkeeping. A request that stops at step N has run one extra step
    # whose result is dropped; its freed slot and blocks are reused only by work queued after it.
    # The exception: a step whose first chunks go first (`first_audio`) is read before the next step's
    # launch (a newcomer's graph prefill may be queued before it is read: `_prefill`).
    def _decode_step(self) -> bool:
        """Launch the next step, deliver the previous one; True if a step was launched. The batch
        runs as one launch per loop bucket (one stream, so in order): each group's CFM loop is its
        own rows' length, not the longest request's."""
        if self._first_chunks_in_flight():
            self._hand_out_in_flight()
        batch = []
        for st in self.scheduler.decode_candidates():
            try:
                if self.fault_hook:
                    self.fault_hook(st, "step")
                self.scheduler.grow_to(st, st.position + 1)
                batch.append(st)
            except Exception as e:
                self._finish(st, "error", f"decode failed: {e}")
        launched, failed = [], []
        plain = self.lora_merging.for_step([st.lora_slot for st in batch]) if batch else True
        behind = bool(self._in_flight)  # a step was in flight: this launch was due before it ended
        for group in self.scheduler.launch_groups(batch):
            try:
                launched.append((group, self._launch_decode(group, plain)))
            except Exception:  # noqa: BLE001 - rerun below, one request at a time
                self._batch_failed("decode launch", len(group), "running it again")
                failed.append(group)
        if batch:
            with self._lock:
                self._stats["steps"] += 1
                self._stats["late_launches"] += behind and bool(launched) and launched[0][1].stream_idle
        previous, self._in_flight = self._in_flight, launched
        if batch:
            timeline.event("step", len(batch))
        # The GPU is busy now: let threads waiting for the GIL (callers of submit()) in before the
        # bookkeeping below; with no blocking wait here they would wait for the interpreter's 5 ms
        # switch interval, which delays first audio under bursts of submits.
        time.sleep(0)
        self._deliver(previous)
        if timeline.ON:
            timeline.event("delivered", sum(len(b) for b, _ in previous))
        run = lambda b: _host_rows(*self.runner.collect(self._launch_decode(b, plain)))  # noqa: E731
        for group in failed:
            still = [st for st in group if self.scheduler.is_running(st)]
            for st, (patch, stop) in self._isolated(still, run, "decode step"):
                self._emit(st, patch, stop)
        return bool(batch)

    def _launch_decode(self, batch: list[RequestState], plain: bool):
        """Launch one model step for `batch` -> the runner's LaunchedStep (plain: `LoraMerging.for_step`)."""
        rows = [(st.slot, int(st.seed_key), st.launched, st.position,
                 self._slots(st, st.position, st.position + 1)[0], st.position + 1,
                 st.block_table, float(st.req.cfg_value), st.req.inference_timesteps, st.lora_slot) for st in batch]
        step = self.runner.launch(rows, plain=plain)
        for st in batch:
            st.launched += 1
        with self._lock:
            self._stats["launches"] += 1
            self._stats["batch_sizes"][len(batch)] += 1
        return step

    def _take_in_flight(self) -> list:
        launched, self._in_flight = self._in_flight, []
        return launched

    def _first_chunks_in_flight(self) -> bool:
        """Whether the step in flight fills first chunks whose audio goes first (`first_audio`)."""
        return self.first_audio is not None and self.scheduler.first_audio_first(
            [st for batch, _ in self._in_flight for st in batch])

    def _hand_out_in_flight(self):
        """Deliver the step in flight; if it filled first chunks, what this thread launches next
        waits on the GPU for their audio (`first_audio`)."""
        mark = self.first_audio.mark() if self._first_chunks_in_flight() else None
        self._deliver(self._take_in_flight())
        if mark is not None:
            launched, event = self.first_audio.fence(mark, FIRST_AUDIO_WAIT_S)
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)
            with self._lock:
                self._stats["first_audio_fences" if launched else "first_audio_fence_misses"] += 1

    def _deliver(self, launched: list):
        """Wait for each launched (batch, step), in launch order, and hand out its patches; rows of
        requests that ended meanwhile are dropped. Every step is collected (that frees its host
        buffers), even if none of its requests is left."""
        for batch, step in launched:
            for st, (patch, stop) in zip(batch, _host_rows(*self.runner.collect(step))):
                if self.scheduler.is_running(st):
                    self._emit(st, patch, stop)

    # -- output
    def _emit(self, st: RequestState, patch: np.ndarray, stop: bool):
        out = self.scheduler.on_patch(st, patch, stop, time.monotonic())
        if out.patches is not None:
            if not self._send(st, LatentChunk(st.request_id, torch.from_numpy(np.stack(out.patches)),
                                              out.first_step)):
                return  # the request has ended with an error
        if out.finish:
            self._finish(st, out.finish)

    def _send(self, st: RequestState, ev: Event) -> bool:
        try:
            st.sink(ev)
            return True
        except Exception as e:  # the receiver is gone or broken: stop working for it
            log.warning("dropping request %s: delivering output failed: %s", st.request_id, e)
            if not isinstance(ev, Finished):
                self._finish(st, "error", f"output delivery failed: {e}")
            return False

    def _finish(self, st: RequestState, reason: str, error: str | None = None):
        """End a request wherever it is; its blocks return to the pool at once."""
        self.scheduler.finish(st)
        self._ended(st, reason, error)

    def _ended(self, st: RequestState, reason: str, error: str | None = None):
        """The scheduler has let go of `st`: forget its id and tell its caller."""
        rid = st.request_id
        with self._lock:
            self._ids.discard(rid)
            self._cancels.pop(rid, None)
            self._stats["finished"] += 1
            if st.lora_slot:
                self.loras.release(st.lora_slot)
                st.lora_slot = 0  # released once
            idle = not self._ids
        if idle:  # nothing left to run: the weights as loaded, before anyone hears of the end
            self.lora_merging.unmerge_safely()
        self._send(st, Finished(rid, reason, st.step, error))


def _host_rows(patches: torch.Tensor, stops: torch.Tensor) -> list:
    """A collected step's rows as (patch [P, D] numpy view, stop bool): no torch op per row. Each
    torch op, and each numpy copy of over 500 elements, lets go of the GIL, and taking it back
    waits up to the interpreter's switch interval while another thread of the process runs Python
    (`execute`, the audio thread; measured in benchmarks/results.md, sixty-sixth session)."""
    return list(zip(patches.numpy(), stops.tolist()))
