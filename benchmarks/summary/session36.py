"""results.md: the thirty-sixth session's section, and results_thirty_sixth.png."""

import os
import re
import statistics

from summary.plots import pyplot, save_panels
from summary.raw import HERE, load, served_ms_per_step, served_row


SERVERS_36 = ((2, "HEAD (b99e7df)", "served_thirtysixth_call2_before.json"),
              (2, "late launch, 4 ms margin", "served_thirtysixth_call2_after.json"),
              (3, "late launch, 4 ms margin, switch interval 0.5 ms", "served_thirtysixth_call3_after.json"),
              (3, "HEAD (b99e7df)", "served_thirtysixth_call3_before.json"),
              (4, "HEAD (b99e7df)", "served_thirtysixth_call4_before.json"),
              (4, "cancel check on the audio thread", "served_thirtysixth_call4_after.json"))


_CLOSED_LOOP_36 = re.compile(r"\[closed-loop\] (\d+) clients, (\w+), round (\d+): ([\d.]+)x, request p50 [\d.]+ ms, "
                             r"first audio p50 ([\d.]+) / p95 ([\d.]+) ms, (\d+) engine steps, ([\d.]+) ms each, .*"
                             r"timed launches (\d+) \((\d+) late\)")


def thirty_sixth_session(res) -> list[str]:
    """2026-11-30 (issue 17): the next step launched shortly before the one in flight ends
    (raw/late_launch_thirtysixth.patch) and the engine thread's cancel check moved to the audio thread
    (raw/audio_thread_cancel_check_thirtysixth.patch), both measured and dropped. Sets res["thirty_sixth"], returns
    the markdown, draws results_thirty_sixth.png."""
    with open(os.path.join(HERE, "raw", "closed_loop_launch_thirtysixth.log")) as f:
        rounds = [{"clients": int(m[1]), "setting": m[2], "round": int(m[3]), "x_real_time": float(m[4]),
                   "first_audio_p50": float(m[5]), "first_audio_p95": float(m[6]), "steps": int(m[7]),
                   "ms_per_step": float(m[8]), "timed_launches": int(m[9]), "late": int(m[10])}
                  for m in _CLOSED_LOOP_36.finditer(f.read())]
    servers = []
    for call, label, name in SERVERS_36:
        for lv in load(name)["levels"]:
            servers.append({"call": call, "server": label, "streams": lv["concurrency"], **served_row(lv),
                            "ms_per_step": served_ms_per_step(lv)})
    res["thirty_sixth"] = {"device": "NVIDIA H200", "closed_loop_rounds": rounds, "servers": servers}
    cl = lambda n, setting, key: [r[key] for r in rounds if r["clients"] == n and r["setting"] == setting]  # noqa: E731
    srv = lambda call, n, tag: next(x for x in servers  # noqa: E731
                                    if x["call"] == call and x["streams"] == n and tag in x["server"])
    md = ["", "## Thirty-sixth session (2026-11-30, H200): a step launched shortly before the one in flight ends, "
          "and the engine thread's cancel check: measured, neither kept", "",
          "Four device calls (about 28 of 30 min). No change to how the server runs; one counter added (below). The thirty-fifth session's probe found a "
          "newcomer's first step about two steps after its admission: the engine launches step N+1 as soon as it has "
          "launched N (before it reads N), so a request that comes in while N runs joins N+2. This session held each "
          "launch back until shortly before the step in flight was expected to end, so that such a request joins "
          "N+1, and separately took an IPC round trip per chunk off the engine thread.", "",
          "**The late launch** (`raw/late_launch_thirtysixth.patch`, against b99e7df, with its tests; `engine/launch_timing.py`, plain "
          "Python): a step's GPU time is estimated per shape (each launch's batch and loop bucket, and whether it runs "
          "the plain network) as the shortest of the last 8 (steps are only ever slowed, by the VAE's work or a "
          "prefill before them); a step starts when the one before it ends, which the host sees when it reads that "
          "one, or at its own launch if later. The "
          "engine thread waits on its condition until the margin before that end, a submit waking it to admit and "
          "prefill the newcomer, which then runs in the held launch. An unknown shape, the CPU and eager engines "
          "launch at once.", "",
          "**In process** (call 1: `closed_loop.py --checkpoint /tmp/full --clients 64,8 --requests 4 --rounds 3 "
          "--settings behind,at_once,margin1,margin6`, the patch's first form, `raw/closed_loop_launch_thirtysixth.log`; "
          "`behind` is that first form's default, a 3 ms margin (the patch in raw/ has 4 ms, as served below), `at_once` "
          "the served code; timed launches are those held for the margin, and late ones came after the step in flight "
          "had ended). The call ran out of time in the "
          "1 ms margin's rounds at 8 clients: one round each of the first two settings there.", "",
          "| clients | setting | x real time (rounds) | wall ms per engine step | engine steps | first audio p50 ms | "
          "timed launches (late) |", "|---|---|---|---|---|---|---|"]
    for n in (64, 8):
        for setting, label in (("at_once", "at once (served)"), ("behind", "3 ms margin"), ("margin6", "6 ms margin"),
                               ("margin1", "1 ms margin")):
            if not cl(n, setting, "x_real_time"):
                continue
            md.append(f"| {n} | {label} | {', '.join(f'{x:.1f}' for x in cl(n, setting, 'x_real_time'))} | "
                      f"{', '.join(f'{x:.2f}' for x in cl(n, setting, 'ms_per_step'))} | "
                      f"{', '.join(str(x) for x in cl(n, setting, 'steps'))} | "
                      f"{', '.join(f'{x:.1f}' for x in cl(n, setting, 'first_audio_p50'))} | "
                      + (", ".join(f"{t} ({late})" for t, late in zip(cl(n, setting, "timed_launches"), cl(n, setting, "late")))
                         if setting != "at_once" else "- (none held)") + " |")
    med = lambda n, setting: statistics.median(cl(n, setting, "x_real_time"))  # noqa: E731
    md += ["",
           f"- At 64 clients the 3 and 6 ms margins made {med(64, 'behind'):.1f}x and {med(64, 'margin6'):.1f}x "
           f"(medians of 3 rounds) against {med(64, 'at_once'):.1f}x launched at once, in as many steps (409-411 for "
           "400 full): in the closed loop the clients move in lockstep waves, a wave's requests end together and its "
           "next requests come together, so few arrive while a full step runs. First audio p50 was 55-61 ms in five "
           "of the six rounds with a 3 or 6 ms margin (80 in one) against 60-65 at once. A few launches a round came "
           "after the step in flight had ended (late).",
           f"- At 8 clients, one round each: {cl(8, 'behind', 'x_real_time')[0]:.1f}x with the 3 ms margin against "
           f"{cl(8, 'at_once', 'x_real_time')[0]:.1f}x at once, {cl(8, 'behind', 'ms_per_step')[0]:.2f} against "
           f"{cl(8, 'at_once', 'ms_per_step')[0]:.2f} ms a step in as many steps.",
           "- A 1 ms margin fell to 143, 67 and 44x: nearly every launch came late, and the host's late read of each "
           "step was taken for its GPU time, so the estimate, and the hold, grew round after round. The patch's final "
           "form takes no estimate from a step that had ended before the host came to read it.", "",
           "**Served** (calls 2-4: `SET=\"decoder.timestep_buckets=10,100\" LEVELS=8,64 REQUESTS=5 bash "
           "benchmarks/run_served_gpu.sh`, two servers a call, HEAD's python_backend (b99e7df) through "
           "`VOXCPM_PYTHON_BACKEND`; "
           "`raw/served_thirtysixth_call*.json.gz`). Calls 2 and 3 ran the late launch with a 4 ms margin; call 3 also "
           "set the interpreter's switch interval to 0.5 ms (`sys.setswitchinterval`, from the engine, with the timing "
           "on):", "",
           "| call | server | streams | x real time | decode steps | wall ms per step | TTFA p50 / p95 ms | smooth |",
           "|---|---|---|---|---|---|---|---|"]
    for x in servers:
        md.append(f"| {x['call']} | {x['server']} | {x['streams']} | {x['x_real_time']:.2f} | {x['steps']:.0f} | "
                  f"{x['ms_per_step']:.2f} | {x['ttfa_p50']:.1f} / {x['ttfa_p95']:.1f} | {100 * x['smooth']:.1f}% |")
    ratio = lambda call, n, tag: srv(call, n, tag)["x_real_time"] / srv(call, n, "HEAD")["x_real_time"]  # noqa: E731
    head = [x for x in servers if x["server"].startswith("HEAD")]
    span = lambda n: [x["x_real_time"] for x in head if x["streams"] == n]  # noqa: E731
    md += ["",
           f"- **Late launch, served** (call 2): {ratio(2, 8, 'late'):.3f}x at 8 streams (steps "
           f"{srv(2, 8, 'HEAD')['steps']:.0f} -> {srv(2, 8, 'late')['steps']:.0f}) and {ratio(2, 64, 'late'):.3f}x at "
           f"64: {srv(2, 64, 'HEAD')['ms_per_step']:.1f} -> {srv(2, 64, 'late')['ms_per_step']:.1f} wall ms a step in "
           "as many steps. Late launches were not counted served; the likely cause, tested by call 3: in the server a "
           "thread woken from a timed wait waits for the GIL up to the interpreter's 5 ms switch interval (the audio "
           "thread and Triton's threads run Python beside it), longer than the margin.",
           f"- **With a 0.5 ms switch interval** (call 3, the late launch first): {ratio(3, 8, 'late'):.3f}x at 8 "
           f"streams and {ratio(3, 64, 'late'):.3f}x at 64: the switch interval accounts for call 2's loss, and what is "
           "left is within the spread. It did run fewer steps: "
           f"{srv(2, 8, 'late')['steps']:.0f} and {srv(3, 8, 'late')['steps']:.0f} at 8 streams (calls 2, 3) against the "
           f"start's {min(x['steps'] for x in head if x['streams'] == 8):.0f}-"
           f"{max(x['steps'] for x in head if x['streams'] == 8):.0f} in three calls, "
           f"{srv(2, 64, 'late')['steps']:.0f} and {srv(3, 64, 'late')['steps']:.0f} at 64 against "
           f"{min(x['steps'] for x in head if x['streams'] == 64):.0f}-"
           f"{max(x['steps'] for x in head if x['streams'] == 64):.0f}; the wall time stayed as it was. "
           "Call 3 changed two things at once, and no server ran the start's code with the shorter switch interval: "
           "the 1.005x belongs to neither alone. Dropped, with its process-wide switch interval "
           "(`raw/late_launch_thirtysixth.patch` is call 3's form; call 2's lacks its two lines of switch interval). "
           "`test_engine_gpu.py`'s test of several launches in flight passed with the patch's first form in call 1 "
           "(its output is not kept in raw/).",
           "- **The cancel check on the audio thread** (call 4, the start first; "
           "`raw/audio_thread_cancel_check_thirtysixth.patch`, against b99e7df). "
           "With `decode_audio` the engine thread asked the stub whether the client had left (an IPC round trip under "
           "IPC_LOCK, behind the audio thread's sends) for each chunk from a request's second on. The patch lets the "
           "audio thread, which asks before each send anyway, set a flag that the engine's sink reads. "
           f"{ratio(4, 8, 'cancel'):.3f}x at 8 streams and {ratio(4, 64, 'cancel'):.3f}x at 64: within the spread. Not "
           "kept: a client that left would be generated for longer (until the audio thread next has a chunk for it, "
           "then to the engine's next chunk). Its CPU tests passed "
           "(`test_decode_audio.py`, the cancelled-request test of `test_resilience.py`).",
           f"- **The start's code** ran three times: {', '.join(f'{x:.2f}' for x in span(8))}x at 8 streams and "
           f"{', '.join(f'{x:.2f}' for x in span(64))}x at 64, a spread of {100 * (max(span(8)) / min(span(8)) - 1):.1f}% "
           f"and {100 * (max(span(64)) / min(span(64)) - 1):.1f}%.",
           f"- **In process, launched at once** (call 1): {min(cl(64, 'at_once', 'x_real_time')):.1f}-"
           f"{max(cl(64, 'at_once', 'x_real_time')):.1f}x at 64 clients, {min(cl(64, 'at_once', 'ms_per_step')):.2f}-"
           f"{max(cl(64, 'at_once', 'ms_per_step')):.2f} wall ms a step; served, "
           f"{min(x['ms_per_step'] for x in head if x['streams'] == 64):.2f}-"
           f"{max(x['ms_per_step'] for x in head if x['streams'] == 64):.2f} wall ms a step in "
           f"{min(x['steps'] for x in head if x['streams'] == 64):.0f}-{max(x['steps'] for x in head if x['streams'] == 64):.0f} "
           "steps (500 full; the closed loop's 410 for 400 would be 512). In process the 64-client target is met "
           "(up from 476.6x in the thirtieth session's closed loop, with 3 requests a client then); what makes a "
           "served step's wall share longer (1-4% at 64 streams) is not measured.", "",
           "**Kept, for the next served run: a late-launch counter.** `voxcpm_engine_late_launches_total` (engine stat "
           "`late_launches`; `bench_served.py` records it per level under `decoder_steps`, `closed_loop.py` per round) "
           "counts the decode steps launched while another was in flight (a step is launched before the one in flight "
           "is read) whose first work found the engine's GPU stream idle (`LaunchedStep.stream_idle`, asked just "
           "before the launch's first copy): the GPU ran out of the engine's work, waiting for its thread. The 1 ms "
           "margin's rounds in call 1 were of this kind (nearly every launch late, by the patch's own count). The next "
           "served run will show whether the default's launches come late. No GPU run of it yet (0 on the CPU; a "
           "CPU test gives its launches stand-in answers). The thirty-fifth session's timing probe is rebuilt for "
           "this code: `raw/request_probe_thirtysixth.patch`.", "",
           f"**Targets** (issue 17), unchanged: the start's code made at best {max(span(8)):.2f}x at 8 streams this session "
           f"(target 150) and {max(span(64)):.2f}x at 64 (target 500), both missed; the rest as the thirty-fifth "
           "session left them.", "",
           "![thirty-sixth session: late launch and cancel check, in process and served](results_thirty_sixth.png)", ""]
    _plot_thirty_sixth(rounds, servers)
    return md


def _plot_thirty_sixth(rounds, servers):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    ax = axes[0]
    settings = (("at_once", "at once (served)", "#888"), ("behind", "3 ms margin", "#286"),
                ("margin6", "6 ms margin", "#163"))
    for i, (setting, label, color) in enumerate(settings):
        xs = [r["x_real_time"] for r in rounds if r["clients"] == 64 and r["setting"] == setting]
        ax.plot([i] * len(xs), xs, "o", color=color, label=label)
    ax.axhline(500, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(settings)), [label for _, label, _ in settings])
    ax.set_ylabel("x real time, each round")
    ax.set_title("in process, 64 clients (call 1; a 1 ms margin: 44-143x, off the chart)", fontsize=9)
    ax = axes[1]
    pairs = [(2, "late", "late launch, 4 ms"), (3, "late", "late launch + 0.5 ms switch"), (4, "cancel", "cancel check")]
    for j, n in enumerate((8, 64)):
        ys = [next(x for x in servers if x["call"] == c and x["streams"] == n and tag in x["server"])["x_real_time"]
              / next(x for x in servers if x["call"] == c and x["streams"] == n and x["server"].startswith("HEAD"))
              ["x_real_time"] for c, tag, _ in pairs]
        ax.bar([i + (j - 0.5) * 0.4 for i in range(len(pairs))], ys, 0.38, color="#286" if n == 8 else "#a64",
               label=f"{n} streams")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0.78, 1.03)
    ax.set_xticks(range(len(pairs)), [f"call {c}: {label}" for c, _, label in pairs], fontsize=8)
    ax.set_ylabel("x real time over the same call's HEAD server")
    ax.set_title("served, paired in one call", fontsize=9)
    ax.legend(fontsize=8)
    save_panels(fig, axes, "Thirty-sixth session, NVIDIA H200, 2026-11-30: late launch and cancel check",
                 "results_thirty_sixth.png")
