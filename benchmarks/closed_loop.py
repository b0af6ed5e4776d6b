"""Closed-loop streams against the engine in process, as the served decoder runs it, without Triton:
the VAE in the engine's process on its audio thread (`decode_audio`, with the first-audio fence),
the served chunk schedule, playback margin, loop buckets and batch limit, one text for every request
(its blocks cached after the first, as in `bench_served.py`). Each of N clients sends a request of
STEPS patches and, once its audio has ended, the next, like a `bench_served.py` worker (a thread of
this script submits it, as Triton's do in the server, not the audio thread). Requests of one length
sent together finish together: the clients run in near-lockstep waves, as in the served burst.

Settings of one engine (`--settings`, the first is the baseline of the ratios) in rotating
rounds, so that all see the same GPU, compile cache and clock; each is the served default with one
thing changed:
  behind        the default: a newcomer's prefill graph queued behind the step in flight at once
                (`EngineConfig.graph_prefill_behind_step`)
  after         that prefill after the step has been handed out (the GPU waits while the host
                reads the step)
  no_fence      no first-audio fence: a step whose first chunks go first is not held for their
                decode's launch, nor the GPU work after it for their decode (`Engine(first_audio=)`)
  audio_normal  the audio thread's CUDA stream at normal priority, not the highest
  vae_off       no VAE work: each decode hands back silence at once, with no copies, launches or
                waits (the engine and the audio thread's bookkeeping as served; a closed stream's
                rows are still zeroed on the audio stream; the fence waits on no decode and so
                rarely misses): what a free VAE would give
  fast_switch   the interpreter's thread switch interval 0.5 ms, not 5 ms (`sys.setswitchinterval`):
                a thread that wants the GIL while another runs Python (the audio thread launching an
                eager decode) waits at most that long
  green<N>      the audio thread's stream on a CUDA green context of N SMs (`green_probe.py`): the
                VAE's kernels confined to those, the rest of the GPU left to the engine's step
  long_pieces   a chunk longer than the longest VAE graph at its batch bucket decodes as that graph's
                consecutive pieces (`VAEStreams.pieces`), not eagerly: far fewer launches from Python
  vae_plain_units  the VAE's residual units each after a look-back pass (`kernels.vae.snake_extend`) on
                plain rows, as before the thirty-first session (no aligned rows, no snake on load, none
                channels-last, products in three TF32 passes): its
                own stream bank and graphs, captured with those kernels.vae constants, which stay set
                through the round for the eager decodes
  vae_rows_tf32x3  the VAE's residual units as before the thirty-fourth session: none channels-last
                (`kernels.vae.unit_cl`), their pointwise products in three TF32 passes; a bank of its own
                as vae_plain_units
  no_split_k    the output and down projections as one GEMM each, not split along K (`model.split_k`,
                VOXCPM_SPLIT_K=0): an engine of its own in this process (the same weights, VAE and audio
                thread; its own KV cache and graphs, captured with the split off: torch.compile traces its
                layers again), built before the rounds; its rounds run with the split off, the others' on
  split_k4      the same projections split into four slices of K, not two (`split_k.SPLITS`): an engine of
                its own as no_split_k
  no_fused_fp8  with `--precision fp8`: layers of e4m3 weights left to the compiled path at every batch,
                not the persistent layer kernel at its few tokens (`persistent_layer.ENABLED_FP8`,
                VOXCPM_FUSED_FP8_LAYERS=0): an engine of its own as no_split_k
Per round: aggregate x real time, per-request time (submit to its audio's end) and first audio
(submit to the first audio chunk; p50 and nearest-rank p95 over the round's requests), the
round's wall time over the engine steps launched in it (prefills, fences and partial batches
included: not the GPU time of a step), the first-audio fences it passed and missed, and the steps
launched late (behind a step in flight, their first work found the engine's GPU stream idle); per
setting, the median of its rounds. The order of the settings rotates from round to round so that
none always goes first.

`--trace N,...`: one more round of the first setting at each of those client counts, under
torch.profiler, summarized by `gpu_timeline.py` (the engine's stream and the audio thread's: busy,
both, neither, the gaps in each); the trace itself is not kept.

    python3 benchmarks/closed_loop.py --checkpoint /tmp/full --clients 1,8,64 --out $OUT/closed_loop.json
    python3 benchmarks/closed_loop.py --checkpoint /tmp/full --precision fp8 --clients 1,8 --max-batch 8 \
        --settings behind,no_fused_fp8 --out $OUT/closed_loop_fp8.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import queue
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import gpu_timeline  # noqa: E402
from cli import timestep_buckets  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig, EngineRequest, Finished  # noqa: E402
from voxcpm_triton.audio.stream_audio import StreamAudio  # noqa: E402
from voxcpm_triton.audio.vae_streams import DecodedAudio, VAEStreams  # noqa: E402
from voxcpm_triton.kernels import persistent_layer  # noqa: E402
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402
from voxcpm_triton.model import split_k  # noqa: E402
from voxcpm_triton.loading import decoding_vae  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog near the quiet river bank, while the children laugh "
        "and play in the warm afternoon sun.")  # bench_served.py's
SCHEDULE = (1, 4, 16)


def log(*a):
    print("[closed-loop]", *a, flush=True)


class Round:
    """N clients, `per_client` requests each, back to back; timestamps per request."""

    def __init__(self, eng: Engine, audio: StreamAudio, prompt, clients: int, per_client: int, steps: int, tag: str):
        self.eng, self.audio, self.prompt, self.steps, self.tag = eng, audio, prompt, steps, tag
        self.left = {c: per_client for c in range(clients)}
        self.times: list = []  # (submit, first audio, end) per request
        self.errors: list = []
        self.lock, self.done = threading.Lock(), threading.Event()
        self.ids = itertools.count()
        self.clients_running = clients
        self.turns: queue.Queue = queue.Queue()  # clients whose next request is due

    def run(self, timeout: float = 600.0) -> dict:
        t0 = time.perf_counter()
        for c in list(self.left):
            self.turns.put(c)
        submitter = threading.Thread(target=self._submit_turns, name=f"{self.tag}-clients", daemon=True)
        submitter.start()
        finished = self.done.wait(timeout)
        self.turns.put(None)
        if not finished or self.errors:
            raise RuntimeError(f"{self.tag}: round did not finish ({self.errors[:3]})")
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "requests": len(self.times), "errors": self.errors, "times": self.times}

    def _submit_turns(self):
        while (c := self.turns.get()) is not None:
            try:
                self._next(c)
            except Exception as e:  # noqa: BLE001 - the round fails at once rather than waiting out its timeout
                self.errors.append(f"submit: {e}")
                self.done.set()
                return

    def _next(self, c: int):
        with self.lock:
            if self.left[c] == 0:
                self.clients_running -= 1
                if self.clients_running == 0:
                    self.done.set()
                return
            self.left[c] -= 1
        i = next(self.ids)
        rid = f"{self.tag}-c{c}-r{i}"
        key = (rid, i)  # the audio thread's key: an id may come back while its audio is still queued
        rec = [time.perf_counter(), None, None]

        def deliver(patches, payload, end=None):  # the audio thread's
            if patches is not None:
                if rec[1] is None:
                    rec[1] = time.perf_counter()
                if end is None:
                    return
                payload = end  # the end, with the last chunk
            rec[2] = time.perf_counter()
            if isinstance(payload, Finished) and payload.error is None:
                with self.lock:
                    self.times.append(tuple(rec))
            else:
                self.errors.append(str(getattr(payload, "error", payload)))
                self.done.set()
                return
            self.turns.put(c)

        def sink(event):  # the engine thread's, as the decoder's (decoder_sinks.to_audio)
            if isinstance(event, Finished):
                self.audio.end(key, event)
            else:
                self.audio.chunk(key, event.patches)

        self.audio.open(key, deliver)
        self.eng.submit(EngineRequest(rid, self.prompt, seed=i, min_len=self.steps, max_len=self.steps), sink=sink)


def summary(r: dict, audio_s: float) -> dict:
    t = r["times"]
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    first = sorted(1000 * (f - s) for s, f, _ in t)
    return {"x_real_time": len(t) * audio_s / r["wall_s"], "wall_s": r["wall_s"], "requests": len(t),
            "errors": len(r["errors"]), "request_ms_p50": ms([e - s for s, _, e in t]),
            "first_audio_ms_p50": ms([f - s for s, f, _ in t]),
            "first_audio_ms_p95": first[min(len(first) - 1, int(0.95 * len(first)))]}


def apply_setting(name: str, eng: Engine, audio: StreamAudio, streams: dict) -> None:
    """The served default with `name`'s one change (between rounds: the engine is quiet)."""
    eng.cfg.graph_prefill_behind_step = name != "after"
    eng.first_audio = None if name == "no_fence" else audio
    if name.startswith("green"):
        if name not in streams:
            from torch.cuda.green_contexts import GreenContext

            ctx = GreenContext.create(num_sms=int(name[len("green"):]), device_id=eng.device.index or 0)
            streams[name] = (ctx, ctx.Stream())  # the context kept alive with its stream
        audio.cuda_stream = streams[name][1]
    else:
        audio.cuda_stream = streams["normal" if name == "audio_normal" else "highest"]
    sys.setswitchinterval(0.0005 if name == "fast_switch" else DEFAULT_SWITCH_S)
    for k, v in {**VAE_DEFAULTS, **VAE_BANKS.get(name, {})}.items():
        setattr(vae_kernels, k, v)
    streams.setdefault("default_bank", audio.streams)
    if name in VAE_BANKS and name not in streams:
        default = streams["default_bank"]
        streams[name] = VAEStreams(default.vae, default.P, default.max_streams, cuda_graphs=default.device.type == "cuda",
                                   graph_patches=SCHEDULE)  # captured with the bank's constants set
    audio.streams = bank = streams[name if name in VAE_BANKS else "default_bank"]
    if name == "vae_off":
        hop = bank.vae.decode_chunk_size  # output samples per latent frame
        bank.decode_async = lambda keys, z: DecodedAudio([torch.zeros(len(keys), z.shape[-1] * hop)], None)
    else:
        bank.__dict__.pop("decode_async", None)  # the class's own again
    if name == "long_pieces":
        bank.pieces = functools.partial(VAEStreams.pieces, bank, past_longest=True)
    else:
        bank.__dict__.pop("pieces", None)


SETTINGS = ("behind", "after", "no_fence", "audio_normal", "vae_off", "fast_switch", "long_pieces", "vae_plain_units",
            "vae_rows_tf32x3", "no_split_k", "split_k4", "no_fused_fp8")
# settings that run on an engine of their own, built with these module flags set (and set for their rounds)
ENGINE_FLAGS = {"no_split_k": ((split_k, "ENABLED", False),), "split_k4": ((split_k, "SPLITS", 4),),
                "no_fused_fp8": ((persistent_layer, "ENABLED_FP8", False),)}
# settings that decode on a VAE stream bank of their own, captured with these kernels.vae constants
VAE_BANKS = {"vae_plain_units": {"SNAKE_ON_LOAD_WIDE": False, "SNAKE_ON_LOAD_UP_TO": 0, "ROW_ALIGN_FROM": 10**9,
                                 "UNIT_CL_CHANNELS": (), "UNIT_DOT_PRECISION": "tf32x3"},
             "vae_rows_tf32x3": {"UNIT_CL_CHANNELS": (), "UNIT_DOT_PRECISION": "tf32x3"}}
VAE_DEFAULTS = {k: getattr(vae_kernels, k) for bank in VAE_BANKS.values() for k in bank}
DEFAULT_SWITCH_S = sys.getswitchinterval()


@contextlib.contextmanager
def engine_flags(name: str):
    """`name`'s module flags (ENGINE_FLAGS) set for the block, restored after."""
    flags = ENGINE_FLAGS.get(name, ())
    old = [getattr(mod, attr) for mod, attr, _ in flags]
    for mod, attr, value in flags:
        setattr(mod, attr, value)
    try:
        yield
    finally:
        for (mod, attr, _), value in zip(flags, old):
            setattr(mod, attr, value)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--requests", type=int, default=5, help="per client and round")
    ap.add_argument("--rounds", type=int, default=2, help="per setting and client count (the settings' order rotates)")
    ap.add_argument("--settings", default="behind,after", help=f"of {', '.join(SETTINGS)}; the first is the baseline")
    ap.add_argument("--trace", default="", help="client counts for a profiled round of the first setting")
    ap.add_argument("--trace-requests", type=int, default=2, help="per client in a profiled round")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--timestep-buckets", type=timestep_buckets, default=(10, 100))
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp8"), help="linear weights (model.precision)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run on the tiny checkpoint (no graphs: "
                    "behind and after run the same eager prefills; no trace)")
    ap.add_argument("--out")
    a = ap.parse_args()
    settings = tuple(a.settings.split(","))
    for name in settings:
        if name not in SETTINGS and not (name.startswith("green") and name[len("green"):].isdigit()):
            raise SystemExit(f"unknown setting {name!r}: one of {', '.join(SETTINGS)}, green<N>")
    if "no_fused_fp8" in settings and a.precision != "fp8":
        raise SystemExit("no_fused_fp8 compares layers of e4m3 weights: it needs --precision fp8")
    dev = torch.device(a.device)
    gpu = dev.type == "cuda"
    t0 = time.monotonic()
    vae = decoding_vae(a.checkpoint, dev, triton_kernels=True, compile=True)[1]
    vox = VoxCPM2.from_pretrained(a.checkpoint, device=a.device, vae=vae, compile=gpu,
                                  dtype=None if gpu else "float32", precision=a.precision)
    audio = StreamAudio(vox.vae, vox.patch_size, 2 * a.max_batch, cuda_graphs=gpu, graph_patches=SCHEDULE,
                        on_failure=lambda key, error: [e.cancel(key[0]) for e in (eng, *engines.values())])
    streams = {"highest": audio.cuda_stream, "normal": torch.cuda.Stream(dev) if gpu else None}

    def new_engine() -> Engine:
        return Engine(vox, EngineConfig(max_num_seqs=a.max_batch, max_waiting=256, chunk_schedule=SCHEDULE,
                                        playback_margin_s=0.1,
                                        timestep_buckets=a.timestep_buckets),
                      first_audio=audio)

    eng = new_engine()
    engines = {}  # setting -> its own engine (ENGINE_FLAGS), built in the try below: its finally ends them
    prompt = vox.prepare_prompt(TEXT)
    audio_s = a.steps * vox.patch_seconds
    res = {"device": torch.cuda.get_device_name() if gpu else "cpu", "precision": a.precision, "steps": a.steps,
           "requests_per_client": a.requests, "rounds": a.rounds, "settings": settings,
           "prompt_positions": len(prompt), "levels": {}, "traces": {}}

    def one_round(name: str, n: int, requests: int, tag: str) -> dict:
        e = engines.get(name, eng)
        apply_setting(name, e, audio, streams)
        counted = ("steps", "first_audio_fences", "first_audio_fence_misses", "late_launches")
        before = e.stats()
        with engine_flags(name):
            s = summary(Round(e, audio, prompt, n, requests, a.steps, tag).run(), audio_s)
        after = e.stats()
        s.update({("engine_" + k if k == "steps" else k): after[k] - before[k] for k in counted})
        rows = {b: c - before["batch_sizes"].get(b, 0) for b, c in after["batch_sizes"].items()}
        s["launch_rows"] = {str(b): c for b, c in sorted(rows.items()) if c}  # rows per launch -> launches
        s["ms_per_engine_step"] = 1000 * s["wall_s"] / s["engine_steps"]  # the round's wall over its steps
        return s

    try:
        for name in (n for n in settings if n in ENGINE_FLAGS):
            # torch.compile guards on the flags: this engine's capture traces its layers again, with them set
            graphs = counters["stats"]["unique_graphs"]
            with engine_flags(name):
                engines[name] = new_engine()
            if gpu and counters["stats"]["unique_graphs"] == graphs:
                raise SystemExit(f"{name}: its engine compiled no graph of its own: its flags did not reach the model")
        log(f"engine ready in {time.monotonic() - t0:.0f} s" + (f" ({1 + len(engines)} engines)" if engines else "")
            + (f"; GPU memory peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if gpu else ""))
        Round(eng, audio, prompt, 8, 1, a.steps, "warm").run()  # first-call effects out of the way
        for n in (int(x) for x in a.clients.split(",") if x):
            rounds = {k: [] for k in settings}
            for r in range(a.rounds):
                k = r % len(settings)
                for name in settings[k:] + settings[:k]:
                    s = one_round(name, n, a.requests, f"{name}{n}r{r}")
                    rounds[name].append(s)
                    log(f"{n} clients, {name}, round {r}: {s['x_real_time']:.1f}x, request p50 "
                        f"{s['request_ms_p50']:.1f} ms, first audio p50 {s['first_audio_ms_p50']:.1f} / p95 "
                        f"{s['first_audio_ms_p95']:.1f} ms, {s['engine_steps']} engine steps, {s['ms_per_engine_step']:.2f} ms each, "
                        f"fences {s['first_audio_fences']} passed / {s['first_audio_fence_misses']} missed, "
                        f"{s['late_launches']} launched late; "
                        f"launches by rows {json.dumps(s['launch_rows'])}")
            level = {name: {"rounds": rs, **{k: statistics.median(x[k] for x in rs)
                                             for k in ("x_real_time", "request_ms_p50", "first_audio_ms_p50",
                                                       "first_audio_ms_p95", "ms_per_engine_step")}}
                     for name, rs in rounds.items()}
            base = settings[0]
            for name in settings[1:]:
                level[f"ratio_x_real_time_{name}_over_{base}"] = level[name]["x_real_time"] / level[base]["x_real_time"]
                log(f"{n} clients: {name}/{base} {level[name]['x_real_time'] / level[base]['x_real_time']:.3f}x")
            res["levels"][str(n)] = level
        for n in (int(x) for x in a.trace.split(",") if x and gpu):
            path = f"/tmp/closed_loop_trace_{os.getpid()}_{n}.json"
            s = gpu_timeline.record(lambda: one_round(settings[0], n, a.trace_requests, f"trace{n}"), path)
            t = gpu_timeline.summarize_file(path)
            os.remove(path)
            # the runtime calls' thread ids, by name: the OS's, and pthread's low 32 bits, unsigned and signed
            # (what kineto writes for CUPTI's calls)
            low = lambda th: th.ident & 0xFFFFFFFF  # noqa: E731
            t.update(round=s, setting=settings[0], threads={
                str(i): name for th, name in ((engines.get(settings[0], eng)._thread, "engine"), (audio.thread, "audio"))
                for i in (th.native_id, low(th), low(th) - (1 << 32) if low(th) >= 1 << 31 else low(th))})
            res["traces"][str(n)] = t
            causes = {sid: st.get("long_gaps_by_cause") for sid, st in t["streams"].items()}
            log(f"{n} clients traced ({settings[0]}): {json.dumps(t.get('split'))}; long gaps by cause "
                f"{json.dumps(causes)}; threads {json.dumps(t['threads'])}; "
                f"{s['engine_steps']} engine steps, {s['x_real_time']:.1f}x under the profiler")
    finally:
        for e in (eng, *engines.values()):
            e.shutdown()
        audio.stop()
    print(json.dumps({n: {k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "rounds"})
                          for k, v in lv.items()} for n, lv in res["levels"].items()}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
