"""Start-up of the decoder engine on a GPU, phase by phase, as the served `decoder` builds it:

    TORCH_LOGS=recompiles python benchmarks/startup_check.py --checkpoint /tmp/full

prints load time, each start-up phase (`Engine.startup_s`) and peak GPU memory; with
TORCH_LOGS=recompiles torch also says what made a compiled function compile again (any
recompile after the decode graphs' first compile is start-up time spent twice).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python_backend"))

import torch  # noqa: E402

from voxcpm_triton import VoxCPM2  # noqa: E402
from voxcpm_triton.engine import Engine, EngineConfig  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-batch", type=int, default=64, help="the decoder's max_batch_size (config.pbtxt: 64)")
    ap.add_argument("--out", help="write the phases as JSON here")
    a = ap.parse_args()
    t0 = time.monotonic()
    vox = VoxCPM2.from_pretrained(a.checkpoint, device="cuda", dtype="bfloat16", compile=True)  # as served
    load = time.monotonic() - t0
    eng = Engine(vox, EngineConfig(max_batch_size=a.max_batch, chunk_schedule=(1, 4, 16)))
    res = {"device": torch.cuda.get_device_name(), "load_s": load, **{f"{k}_s": v for k, v in eng.startup_s.items()},
           "total_s": time.monotonic() - t0, "gpu_mem_peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    eng.shutdown()
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
