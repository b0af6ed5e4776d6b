"""Where a stretch of GPU work spent its time, stream by stream, from a torch.profiler trace.

`record(fn, path)` runs fn under the profiler (CUDA activity only: kernels, copies and sets, those
replayed from CUDA graphs included) and writes the Chrome trace. `summarize(trace)` turns the
trace's device events into:
  - per stream: busy time (the union of its events), event count, the gaps between its events
    split into short ones (< `short_gap_us`: a graph's or a queue's launch latency, the GPU
    starting the next kernel) and long ones (the stream waited: for the host, an event, nothing
    to do), and its costliest kernels;
  - for the two busiest streams (the engine's and the audio thread's, in closed_loop.py), how the
    wall time from the first event to the last divides: only the first busy, only the second,
    both, and neither (the GPU idle for both).
"""

from __future__ import annotations

import json

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def record(fn, path: str):
    """fn() under torch.profiler, CUDA activity only -> fn's result; the Chrome trace goes to path."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    return out


def _union(intervals: list) -> list:
    """Sorted, merged [start, end) intervals."""
    merged: list = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _length(intervals: list) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: list, b: list) -> list:
    """Two merged interval lists -> their intersection (merged)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def summarize(trace: dict, short_gap_us: float = 20.0, top: int = 8) -> dict:
    """A Chrome trace (dict, as torch.profiler writes it) -> the summary above; times in ms."""
    by_stream: dict = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") not in DEVICE_CATS:
            continue
        s = float(ev["ts"])
        by_stream.setdefault(ev.get("args", {}).get("stream", -1), []).append((s, s + float(ev.get("dur", 0.0)), ev))
    if not by_stream:
        return {"streams": {}, "wall_ms": 0.0}
    streams, busy = {}, {}
    for sid, evs in by_stream.items():
        busy[sid] = _union([(s, e) for s, e, _ in evs])
        short = long = 0.0
        n_long = 0
        for (_, e0), (s1, _) in zip(busy[sid], busy[sid][1:]):
            gap = s1 - e0
            if gap < short_gap_us:
                short += gap
            else:
                long += gap
                n_long += 1
        kernels: dict = {}
        for s, e, ev in evs:
            k = kernels.setdefault(ev.get("name", "?"), [0, 0.0])
            k[0] += 1
            k[1] += e - s
        streams[str(sid)] = {
            "events": len(evs), "busy_ms": _length(busy[sid]) / 1e3,
            "short_gaps_ms": short / 1e3, "long_gaps_ms": long / 1e3, "long_gaps": n_long,
            "top": [{"name": n[:120], "calls": c, "ms": t / 1e3}
                    for n, (c, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]]}
    t0 = min(iv[0][0] for iv in busy.values())
    t1 = max(iv[-1][1] for iv in busy.values())
    out = {"wall_ms": (t1 - t0) / 1e3, "streams": streams}
    ranked = sorted(busy, key=lambda sid: -_length(busy[sid]))
    if len(ranked) >= 2:
        a, b = busy[ranked[0]], busy[ranked[1]]
        both = _length(_intersection(a, b))
        either = _length(_union([tuple(x) for x in a + b]))
        anything = _length(_union([tuple(x) for iv in busy.values() for x in iv]))
        out["split"] = {"first": str(ranked[0]), "second": str(ranked[1]),
                        "first_only_ms": (_length(a) - both) / 1e3, "second_only_ms": (_length(b) - both) / 1e3,
                        "both_ms": both / 1e3, "neither_ms": (t1 - t0 - either) / 1e3,
                        "idle_ms": (t1 - t0 - anything) / 1e3}
    return out


def summarize_file(path: str, **kw) -> dict:
    with open(path) as f:
        return summarize(json.load(f), **kw)
