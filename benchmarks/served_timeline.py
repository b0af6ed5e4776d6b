"""Where a served level's late chunks were held: the server's timeline (VOXCPM_TIMELINE, written by
its processes) against the clients' times (bench_served.py's served.json), on the machine's one
monotonic clock.

For each stream that ran dry: when its late chunk was sent by the decoder's audio thread, passed on
by the orchestrator and received by the client, and what the decoder did in between (steps, prefills,
audio rounds). Over the level, in bins: the decoder's steps, its audio rounds' patches, the chunks
the decoder sent, the orchestrators passed on and the clients received.

    python benchmarks/served_timeline.py --served served.json --timeline timeline/ [--level 3] [--plot t.png]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tarfile
import tempfile
from collections import defaultdict


def load_timeline(directory: str) -> list:
    """Every process's events, (t, pid, thread, name, value), in time order."""
    events = []
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        pid = int(os.path.basename(path).split(".")[0])
        with open(path) as f:
            for line in f:
                try:
                    t, thread, name, value = json.loads(line)
                except ValueError:  # a last line cut short (the writer is a daemon thread)
                    continue
                events.append((t, pid, thread, name, value))
    return sorted(events, key=lambda e: (e[0], e[1]))


def load_timeline_tar(path: str) -> list:
    """`load_timeline` of a timeline directory kept as a tarball (its one folder `timeline`)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(path) as tar:
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        return load_timeline(os.path.join(tmp, "timeline"))


def client_chunks(level: dict) -> list:
    """(t received, client id, seconds of audio) of every chunk of the level, on the monotonic clock."""
    t0 = level["t0_monotonic"]
    return sorted((t0 + s["start_s"] + ms / 1e3, s["request_id"], audio_ms / 1e3)
                  for s in level["streams"] for ms, audio_ms in s.get("chunk_ms") or [])


def dry_streams(level: dict) -> list:
    """The level's streams that ran dry (at a known chunk)."""
    return [s for s in level["streams"] if s.get("underrun_s", 0) > 0 and s.get("underrun_chunk") is not None]


def stream_path(level: dict, events: list, s: dict) -> dict:
    """A dry stream's chunks up to the one it waited for: seconds from its request to the client's
    receipt of each and to the orchestrator's emit of each, and the difference (the transport's), ms."""
    t0 = level["t0_monotonic"] + s["start_s"]
    # (ids repeat from level to level: this request's emits are those after it was sent)
    emits = [t for t, _, _, name, value in events if name == "emit" and value == s["request_id"] and t >= t0]
    k = s["underrun_chunk"]
    received = [t0 + ms / 1e3 for ms, _ in s["chunk_ms"]]
    return {"id": s["request_id"], "dry_ms": round(s["underrun_s"] * 1e3, 1), "chunk": k,
            "received_s": [round(t - t0, 4) for t in received[:k + 1]],
            "emitted_s": [round(t - t0, 4) for t in emits[:k + 1]],
            "client_lag_ms": [round((r - e) * 1e3, 1) for r, e in zip(received[:k + 1], emits[:k + 1])]}


def round_launch_ms(level: dict, events: list) -> list:
    """The decoder's audio rounds within the level: ms from each round's start (its work taken) to
    its decodes launched, the host work of putting its latents together and queueing them."""
    t0, t1 = level["t0_monotonic"], level["t0_monotonic"] + level["wall_s"]
    out, start = [], {}
    for t, pid, _, name, _ in events:
        if t0 <= t < t1 and name == "round":
            start[pid] = t
        elif t0 <= t < t1 and name == "decodes_launched" and pid in start:
            out.append((t - start.pop(pid)) * 1e3)
    return out


def bins(level: dict, events: list, width: float = 0.01) -> dict:
    """Per bin of `width` s from the level's start: steps, prefills, round patches, decoder sends,
    orchestrator emits, client receives."""
    t0, t1 = level["t0_monotonic"], level["t0_monotonic"] + level["wall_s"]
    out = defaultdict(lambda: defaultdict(float))
    for t, _, _, name, value in events:
        if not t0 <= t < t1:
            continue
        b = int((t - t0) / width)
        if name == "step":
            out[b]["steps"] += 1
        elif name == "prefill":
            out[b]["prefilled"] += value
        elif name == "round":
            out[b]["round_patches"] += value[1]
        elif name == "send":
            out[b]["sends"] += 1
        elif name == "emit":
            out[b]["emits"] += 1
    for t, _, _ in client_chunks(level):
        if t0 <= t < t1:
            out[int((t - t0) / width)]["received"] += 1
    return {b: dict(v) for b, v in sorted(out.items())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--served", required=True)
    ap.add_argument("--timeline", required=True, help="the VOXCPM_TIMELINE directory")
    ap.add_argument("--level", type=int, default=None, help="index into served.json's levels (default: all)")
    ap.add_argument("--bin-ms", type=float, default=10.0)
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    with open(args.served) as f:
        served = json.load(f)
    events = load_timeline(args.timeline)
    result = []
    for i, level in enumerate(served["levels"]):
        if args.level is not None and i != args.level:
            continue
        paths = [stream_path(level, events, s) for s in dry_streams(level)]
        b = bins(level, events, args.bin_ms / 1e3)
        launches = sorted(round_launch_ms(level, events))
        result.append({"index": i, "concurrency": level["concurrency"], "smooth": level["smooth_playback_frac"],
                       "dry": paths, "round_launch_ms": launches, "bins": b})
        worst = f", slowest round launch {launches[-1]:.1f} ms of {len(launches)}" if launches else ""
        print(f"level {i}: {level['concurrency']} streams, smooth {level['smooth_playback_frac']:.3f}, "
              f"{len(paths)} dry{worst}")
        for p in paths:
            print("  ", json.dumps(p))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bin_ms": args.bin_ms, "levels": result}, f)


if __name__ == "__main__":
    main()
