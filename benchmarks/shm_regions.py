"""How the Python backend's shared-memory regions grow under bursts of streams.

Each Python model instance (and the server's side of it) talks through a region in /dev/shm that
Triton 2.51 creates at `shm-default-byte-size` (1 MiB) and grows by `shm-growth-byte-size` (1 MiB)
when a tensor does not fit; each growth maps the whole region again, in both processes. This starts
a real tritonserver on the model repository (tests/server.py; the embedded tiny checkpoint on the
CPU unless VOXCPM_CHECKPOINT says otherwise), sends BURSTS bursts of `bench_served.py` streams, and
prints every region's size (MiB; after start-up also how much of it is allocated RAM) and, after
each burst, the burst's aggregate x real time, the decoder's audio deliveries (ms each: a decoded
chunk's wait and its send to the client) and, of the server and of each model's stubs
(`page_faults.py`), the minor page faults in the burst and the resident memory after it, with how
much of that is shared memory mapped.

    .venv/bin/python benchmarks/shm_regions.py [--streams 32] [--patches 40] [--bursts 3]
        [--model-repository D (scripts/repository_copy.py makes one with other parameters)]
        [--json-out F] [-- extra tritonserver arguments, e.g. --backend-config=python,...]
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from page_faults import by, delta, usage  # noqa: E402
from server import TritonServer  # noqa: E402

# this run's regions alone: other servers' (a test suite's, a deployment's) keep Triton's default prefix
PREFIX = f"voxcpm_shm_regions_{os.getpid()}_"


def regions_mib(allocated: bool = False) -> list[int]:
    """This run's Python backend regions in /dev/shm, MiB each, smallest first: their sizes, or how much of
    each holds pages (its blocks)."""
    stats = [os.stat(f) for f in glob.glob(f"/dev/shm/{PREFIX}*")]
    return sorted((st.st_blocks * 512 if allocated else st.st_size) >> 20 for st in stats)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--patches", type=int, default=40, help="each request's length in patches")
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--model-repository", default=os.path.join(HERE, "..", "model_repository"))
    ap.add_argument("--json-out")
    ap.add_argument("server_args", nargs="*", help="after --: extra tritonserver arguments")
    a = ap.parse_args()
    out = {"streams": a.streams, "patches": a.patches, "server_args": a.server_args, "bursts": [],
           "model_repository": os.path.abspath(a.model_repository),
           # glibc's malloc tunables the server and its stubs inherit (how their heaps give pages back)
           "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}
    args = [f"--backend-config=python,shm-region-prefix-name={PREFIX}", *a.server_args]
    # the server's log beside the results (without them, a temporary file that tests/server.py leaves)
    log_path = os.path.splitext(a.json_out)[0] + "_tritonserver.log" if a.json_out else None
    with TritonServer(a.model_repository, args=args, log_path=log_path) as s:
        out["after_start_mib"] = regions_mib()
        # RAM, not just address space: Triton allocates a region's pages as it creates it
        out["after_start_allocated_mib"] = regions_mib(allocated=True)
        print(f"after start: {out['after_start_mib']}, allocated {out['after_start_allocated_mib']}", flush=True)
        before = usage(s.pid)
        for i in range(a.bursts):
            with tempfile.TemporaryDirectory() as tmp:
                level = os.path.join(tmp, "level.json")
                subprocess.run([sys.executable, os.path.join(HERE, "bench_served.py"), "--url", s.grpc_url,
                                "--concurrency", str(a.streams), "--requests-per-worker", "1", "--min-length",
                                str(a.patches), "--max-length", str(a.patches), "--warmup", "0", "--quiet",
                                "--metrics-url", s.metrics_url, "--json-out", level],
                               env=s.env, check=True, stdout=subprocess.DEVNULL)
                with open(level) as f:
                    lv = json.load(f)["levels"][0]
            steps = lv["decoder_steps"]
            burst = {"x_real_time": round(lv["x_real_time"], 2), "ttfa_ms_p50": round(lv["ttfa_ms"]["p50"], 1),
                     "delivery_ms": round(1000 * steps["audio_send_s"] / max(steps["audio_sends"], 1), 3),
                     "sizes_mib": regions_mib()}
            now = usage(s.pid)
            burst["minor_faults"] = delta(before, now)
            burst["resident_mib"] = by("resident_mib", now)
            burst["shared_mib"] = by("shared_mib", now)  # of it, the regions' pages each process has mapped
            before = now
            out["bursts"].append(burst)
            print(f"burst {i + 1}: {burst}", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
