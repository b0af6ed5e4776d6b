"""Whether the VAE decoder can run on a CUDA green context's share of the SMs, and what that costs it.

In the closed loop's traces (`closed_loop.py --trace`) the VAE's kernels, on the highest-priority stream,
take every SM while they run: the engine's queued step waits inside its graph. A green context
(`torch.cuda.green_contexts.GreenContext`, CUDA 12.4+) confines a stream's work to some SMs, which
would leave the rest to the engine. This checks, before any serving code depends on it:
  - a decode on a green context's stream (eager, Triton kernels included, and a CUDA graph captured
    on the default context and replayed there) gives the same audio as on an ordinary stream;
  - how long a decode takes on N SMs against the whole GPU (so that the confinement is real).

    python3 benchmarks/green_probe.py --checkpoint /tmp/full --sms 16,40,66 --out green_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

from voxcpm_triton.audio.vae_streams import VAEStreams  # noqa: E402
from voxcpm_triton.kernels import vae as vae_kernels  # noqa: E402
from voxcpm_triton.loading import load_audio_vae  # noqa: E402


def log(*a):
    print("[green-probe]", *a, flush=True)


def decode_on(stream, bank: VAEStreams, keys: list, z: torch.Tensor) -> torch.Tensor:
    """z for `keys` from silence, on `stream` -> audio (CPU)."""
    for k in keys:
        bank.close(k)
        bank.open(k)
    with torch.cuda.stream(stream):
        return bank.decode(keys, z)


def gpu_ms(stream, bank: VAEStreams, keys: list, z: torch.Tensor, reps: int) -> float:
    times = []
    for _ in range(reps):
        with torch.cuda.stream(stream):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            bank.decode_async(keys, z)
            b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="/tmp/full")
    ap.add_argument("--sms", default="16,33,66")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="green_probe.json")
    a = ap.parse_args()
    from torch.cuda import green_contexts

    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "sm_count": torch.cuda.get_device_properties(dev).multi_processor_count,
           "supported": bool(getattr(green_contexts, "SUPPORTED", False)), "shapes": {}}
    log(json.dumps(out))
    cfg, vae = load_audio_vae(a.checkpoint, dev, triton_kernels=vae_kernels.available(), compile=True)
    bank = VAEStreams(vae, cfg.patch_size, max_streams=64, cuda_graphs=True)
    plain = torch.cuda.Stream(dev)
    greens = {}
    for n in (int(x) for x in a.sms.split(",")):
        t0 = time.perf_counter()
        try:
            ctx = green_contexts.GreenContext.create(num_sms=n, device_id=dev.index or 0)
            greens[n] = (ctx, ctx.Stream())
            log(f"green context of {n} SMs in {time.perf_counter() - t0:.2f} s")
        except Exception as e:  # noqa: BLE001 - recorded
            out.setdefault("errors", {})[str(n)] = repr(e)
            log(f"green context of {n} SMs: {e!r}")
    for shape in ("8x4", "64x4", "64x16"):  # graph, graph, eager (as served)
        b, patches = (int(x) for x in shape.split("x"))
        keys = list(range(b))
        z = torch.randn(b, vae.latent_dim, patches * cfg.patch_size, generator=torch.Generator().manual_seed(b))
        ref = decode_on(plain, bank, keys, z)
        row = {"graph": bank.pieces(b, z.shape[-1]) is not None, "all_sms_ms": gpu_ms(plain, bank, keys, z, a.reps)}
        for n, (_, stream) in greens.items():
            try:
                audio = decode_on(stream, bank, keys, z)
                row[f"sms{n}"] = {"ms": gpu_ms(stream, bank, keys, z, a.reps),
                                  "max_abs_vs_plain": (audio - ref).abs().max().item()}
            except Exception as e:  # noqa: BLE001 - recorded
                row[f"sms{n}"] = {"error": repr(e)}
        out["shapes"][shape] = row
        log(shape, json.dumps(row))
        for k in keys:
            bank.close(k)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    # torch 2.11 aborts at exit here ("context is destroyed"): a tensor used on a green context's stream
    # freed after its context. Seen once; the results are written by then.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
