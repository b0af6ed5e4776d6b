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
    both, and neither (the GPU idle for both);
  - how much of the first stream's long gaps the second stream was busy for (`split`);
  - per stream, whose its long gaps are, where the trace holds the CUDA runtime calls (their
    `correlation` ties each device event to the call that queued it): the part of a gap before
    the call that queued the next event began is the host's (nothing was queued: the launching
    thread was late), the rest the device's (queued, and waiting on an event, another stream, free
    SMs or the launch itself); `within_one_launch_ms` is the part of the gaps between two events of
    one launch (kernels of one graph replay). The host's part is split by launching thread, and the
    part of it that thread spent inside a synchronizing call (waiting on the GPU itself) is counted apart.
"""

from __future__ import annotations

import json

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


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
    calls, syncs = _runtime_calls(trace)
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
        if calls:
            streams[str(sid)]["long_gaps_by_cause"] = _gap_causes(evs, busy[sid], calls, syncs, short_gap_us)
    t0 = min(iv[0][0] for iv in busy.values())
    t1 = max(iv[-1][1] for iv in busy.values())
    out = {"wall_ms": (t1 - t0) / 1e3, "streams": streams}
    ranked = sorted(busy, key=lambda sid: -_length(busy[sid]))
    if len(ranked) >= 2:
        a, b = busy[ranked[0]], busy[ranked[1]]
        both = _length(_intersection(a, b))
        either = _length(_union([tuple(x) for x in a + b]))
        anything = _length(_union([tuple(x) for iv in busy.values() for x in iv]))
        gaps_a = [[e0, s1] for (_, e0), (s1, _) in zip(a, a[1:]) if s1 - e0 >= short_gap_us]
        out["split"] = {"first": str(ranked[0]), "second": str(ranked[1]),
                        "first_long_gaps_second_busy_ms": _length(_intersection(gaps_a, b)) / 1e3,
                        "first_only_ms": (_length(a) - both) / 1e3, "second_only_ms": (_length(b) - both) / 1e3,
                        "both_ms": both / 1e3, "neither_ms": (t1 - t0 - either) / 1e3,
                        "idle_ms": (t1 - t0 - anything) / 1e3}
    return out


def _runtime_calls(trace: dict) -> tuple[dict, dict]:
    """-> ({correlation: (start, end, thread, name)} of the runtime calls, {thread: merged intervals
    of its synchronizing calls})."""
    calls, syncs = {}, {}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or ev.get("cat") not in RUNTIME_CATS:
            continue
        s, e, tid, name = float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0)), ev.get("tid"), ev.get("name", "?")
        corr = ev.get("args", {}).get("correlation")
        if corr is not None:
            calls[corr] = (s, e, tid, name)
        if "Synchronize" in name:
            syncs.setdefault(tid, []).append((s, e))
    return calls, {tid: _union(iv) for tid, iv in syncs.items()}


def _gap_causes(evs: list, busy: list, calls: dict, syncs: dict, short_gap_us: float) -> dict:
    """A stream's long gaps split into the host's part and the device's (module docstring)."""
    first_at: dict = {}  # a busy stretch's start -> the event that starts it
    for s, _, ev in sorted(evs, key=lambda x: x[0]):
        first_at.setdefault(s, ev)
    host = device = unmatched = in_sync = 0.0
    by_thread: dict = {}
    launched_by: dict = {}
    last_at: dict = {}  # a busy stretch's end -> the event that ends it
    for _, e, ev in sorted(evs, key=lambda x: x[1]):
        last_at[e] = ev
    within = 0.0  # gaps between two events of one launch (a graph's kernels)
    for (_, e0), (s1, _) in zip(busy, busy[1:]):
        gap = s1 - e0
        if gap < short_gap_us:
            continue
        corr = first_at[s1].get("args", {}).get("correlation")
        if corr is not None and corr == last_at[e0].get("args", {}).get("correlation"):
            within += gap
        call = calls.get(corr)
        if call is None:
            unmatched += gap
            continue
        c0, _, tid, name = call
        late = min(max(c0 - e0, 0.0), gap)  # nothing queued until the call began
        host += late
        device += gap - late
        by_thread[str(tid)] = by_thread.get(str(tid), 0.0) + late
        launched_by[name] = launched_by.get(name, 0) + 1
        in_sync += _length(_intersection([[e0, e0 + late]], syncs.get(tid, []))) if late > 0 else 0.0
    return {"host_ms": host / 1e3, "device_ms": device / 1e3, "unmatched_ms": unmatched / 1e3,
            "within_one_launch_ms": within / 1e3,
            "host_in_sync_ms": in_sync / 1e3, "host_ms_by_thread": {t: v / 1e3 for t, v in by_thread.items()},
            "next_launched_by": launched_by}


def summarize_file(path: str, **kw) -> dict:
    with open(path) as f:
        return summarize(json.load(f), **kw)
