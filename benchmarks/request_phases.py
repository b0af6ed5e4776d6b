"""Where a served request's time goes, phase by phase, from the timing probe.

The probe (`raw/request_probe_thirtyfifth.patch`, applied to the tree before the run) writes one
line per event, `<monotonic s> <thread> <event> <fields...>`, to a file per process under
$VOXCPM_PROBE_DIR: the orchestrator (`odec`: its decoder call, with its own start; `oemit`: a
chunk forwarded to the client; `oend`), the decoder's `execute` (`exec`, `sub`), the engine thread
(`adm`, `pre`, `l0`: first step launched, `chunk`: a chunk handed to the audio thread, `step`,
`deliv`) and the audio thread (`rtake`, `rlaunch`, `rres`, `asent`: a chunk's audio sent, `aend`:
the end sent, `rdone`). bench_served.py's JSON, with the patch's `t_origin_monotonic` per level,
splits them by level. Linux's monotonic clock is one clock for every process of the machine.
`odec` is written when the orchestrator's decoupled call has returned: "prepare" includes that
call's own time, and "decoder call -> execute" starts after it.

    python benchmarks/request_phases.py served.json.gz probe_dir [--json-out phases.json]

Per level: the median and 90th percentile (the lower of the two nearest ranks) of each phase
over the level's requests (ms), the steps, their mean rows, and the audio threads' rounds (busy
time, the gap between two sends: an upper bound on a send's cost, since ends and waits for a
batch's audio fall between sends too), each decoder process's thread on its own.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import statistics

# phase -> (from, to): each an event name, or (name, index) into a request's list of that event
PHASES = {
    "prepare (orchestrator start -> decoder call)": ("o_t0", "odec"),
    "decoder call -> execute": ("odec", "exec"),
    "execute -> submitted": ("exec", "sub"),
    "submitted -> admitted": ("sub", "adm"),
    "admitted -> prefill launched": ("adm", "pre"),
    "prefill -> first step launched": ("pre", "l0"),
    "first step launched -> first chunk": ("l0", ("chunk", 0)),
    "first chunk -> its audio sent": (("chunk", 0), ("asent", 0)),
    "audio sent -> orchestrator": (("asent", 0), ("oemit", 0)),
    "first audio in the orchestrator": ("o_t0", ("oemit", 0)),
    "last chunk -> its audio sent": (("chunk", -1), ("asent", -1)),
    "last audio sent -> end sent": (("asent", -1), "aend"),
    "end sent -> orchestrator's end": ("aend", "oend"),
}


def load_events(probe_dir: str) -> list:
    """(time, process file, thread, event, fields) of every line, in time order."""
    events = []
    for path in glob.glob(os.path.join(probe_dir, "probe-*.txt")):
        with open(path) as f:
            for line in f:
                t, thread, name, *fields = line.split()
                events.append((float(t), os.path.basename(path), thread, name, fields))
    events.sort()
    return events


def requests_of(events: list) -> dict:
    """request id -> event name -> [times] (odec also gives o_t0, the orchestrator's start)."""
    reqs: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for t, _, _, name, fields in events:
        if name in ("odec", "exec", "sub", "adm", "pre", "l0", "chunk", "asent", "oemit", "aend", "oend"):
            reqs[fields[0]][name].append(t)
            if name == "odec":
                reqs[fields[0]]["o_t0"].append(float(fields[1]))
    return reqs


def _at(r: dict, point):
    name, i = point if isinstance(point, tuple) else (point, 0)
    return r[name][i]


def _stats(values: list) -> dict:
    v = sorted(values)
    return {"p50_ms": round(statistics.median(v) * 1e3, 2), "p90_ms": round(v[int(0.9 * (len(v) - 1))] * 1e3, 2),
            "n": len(v)}


def level_phases(events: list, reqs: dict, t0: float, t1: float) -> dict:
    mine = [r for r in reqs.values() if r["o_t0"] and t0 - 0.01 <= r["o_t0"][0] <= t1]
    phases = {}
    for phase, (a, b) in PHASES.items():
        vals = []
        for r in mine:
            try:
                vals.append(_at(r, b) - _at(r, a))
            except IndexError:  # a request without that event (an error, the probe's start)
                pass
        if vals:
            phases[phase] = _stats(vals)
    mid = [statistics.median([s - c for c, s in zip(r["chunk"][2:-1], r["asent"][2:-1])])
           for r in mine if len(r["chunk"]) > 3 and len(r["asent"]) == len(r["chunk"])]
    if mid:
        phases["a middle chunk -> its audio sent (median per request)"] = _stats(mid)
    inside = [e for e in events if t0 <= e[0] <= t1]
    steps = [int(f[0]) for _, _, _, name, f in inside if name == "step"]
    rounds, sends, gaps, busy = 0, 0, [], 0.0
    round_of: dict = {}  # process file -> [start of its audio thread's round, its last send] while one runs
    for t, src, _, name, _ in inside:
        if name == "rtake":
            round_of[src] = [t, None]
        elif name == "asent" and src in round_of:
            if round_of[src][1] is not None:
                gaps.append(t - round_of[src][1])
            round_of[src][1], sends = t, sends + 1
        elif name == "rdone" and src in round_of:
            rounds, busy = rounds + 1, busy + t - round_of.pop(src)[0]
    return {"requests": len(mine), "phases": phases,
            "steps": len(steps), "rows_per_step": round(sum(steps) / max(len(steps), 1), 2),
            "audio_rounds": rounds, "audio_sends": sends, "audio_busy_s": round(busy, 3),
            "wall_s": round(t1 - t0, 3), "send_gap": _stats(gaps) if gaps else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("served_json", help="bench_served.py's JSON (.gz too), run with the probe")
    ap.add_argument("probe_dir", help="the run's $VOXCPM_PROBE_DIR")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    opener = gzip.open if args.served_json.endswith(".gz") else open
    with opener(args.served_json, "rt") as f:
        served = json.load(f)
    events = load_events(args.probe_dir)
    reqs = requests_of(events)
    out = {}
    for lv in served["levels"]:
        t0 = lv["t_origin_monotonic"]
        res = out[str(lv["concurrency"])] = level_phases(events, reqs, t0, t0 + lv["wall_s"])
        print(f"== {lv['concurrency']} streams: {res['requests']} requests, {res['steps']} steps, "
              f"{res['rows_per_step']} rows a step, x real time {lv['x_real_time']:.2f}")
        for phase, s in res["phases"].items():
            print(f"  {phase:58s} p50 {s['p50_ms']:8.2f}  p90 {s['p90_ms']:8.2f} ms")
        print(f"  audio thread: {res['audio_rounds']} rounds, busy {res['audio_busy_s']} of {res['wall_s']} s, "
              f"{res['audio_sends']} sends" + (f", {res['send_gap']['p50_ms']} ms apart (p50)" if res["send_gap"] else ""))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
