"""results.md: the thirty-fifth session's section, and results_thirty_fifth.png."""

from summary.plots import pyplot, save_panels
from summary.raw import load, served_row


SERVERS_35 = (("before the channels-last VAE (0f71a82), no probe", "served_thirtyfifth_call1_before.json", 1),
              ("session start (a6d0349), probe", "served_thirtyfifth_call1_after.json", 1),
              ("session start (a6d0349), probe", "served_thirtyfifth_call2_before.json", 2),
              ("last chunk padded, end first, probe", "served_thirtyfifth_call2_after.json", 2),
              ("last chunk padded, end first, probe", "served_thirtyfifth_call3_graphs256.json", 3),
              ("+ VAE graphs up to 64 x 16, probe", "served_thirtyfifth_call3_graphs1024.json", 3),
              ("final (1fccf2b's server), no probe", "served_thirtyfifth_final.json", 4))


PHASES_35 = ("decoder call -> execute", "submitted -> admitted", "admitted -> prefill launched",
             "first step launched -> first chunk", "first chunk -> its audio sent",
             "a middle chunk -> its audio sent (median per request)", "last chunk -> its audio sent",
             "last audio sent -> end sent", "first audio in the orchestrator")


def thirty_fifth_session(res) -> list[str]:
    """2026-11-30 (issue 17): a served request's path timed phase by phase (raw/request_probe_thirtyfifth.patch,
    request_phases.py); a request's last chunk decoded as one padded graph replay and its end sent right after its
    audio (kept); VAE graphs up to 64 x 16 (dropped). Sets res["thirty_fifth"], returns the markdown, draws
    results_thirty_fifth.png."""
    servers = []
    for label, name, call in SERVERS_35:
        for lv in load(name)["levels"]:
            servers.append({"server": label, "call": call, "streams": lv["concurrency"], **served_row(lv)})
    phases = load("request_phases_thirtyfifth.json")
    res["thirty_fifth"] = {"device": "NVIDIA H200", "servers": servers,  # the phases' p50s, call 2 (raw/: all)
                           "request_phases_p50_ms": {k: {n: {name: v["p50_ms"] for name, v in lv["phases"].items()}
                                                         for n, lv in phases[k].items()}
                                                     for k in ("call2_before_a6d0349", "call2_after_last_chunk")}}
    srv = lambda call, n, tag: next(x for x in servers  # noqa: E731
                                    if x["call"] == call and x["streams"] == n and tag in x["server"])
    ph = lambda key, n, name: phases[key][str(n)]["phases"][name]["p50_ms"]  # noqa: E731
    b, a, c1 = "call2_before_a6d0349", "call2_after_last_chunk", "call1_a6d0349"
    fin8, fin64 = srv(4, 8, "final"), srv(4, 64, "final")
    md = ["", "## Thirty-fifth session (2026-11-30, H200): where a served request's time goes; a request's last "
          "chunk no longer waits for the round", "",
          "Four device calls (about 27.7 of 30 min). The thirty-third session found the served levels running 4-6% "
          "more decode steps than the 500 full steps their requests need: each stream's row is empty from its "
          "request's last step until its next request's first. This session timed a request's whole path through "
          "the server, found where that time goes at its end, and cut it.", "",
          "**The probe** (not committed: `raw/request_probe_thirtyfifth.patch` applies to this session's final code, "
          "`raw/request_probe_thirtyfifth_a6d0349.patch` to its start, as the start's servers ran it; "
          "`benchmarks/request_phases.py`, new, reads its files). Monotonic timestamps, one file per process: the orchestrator's decoder call and each chunk it "
          "forwards, the decoder's `execute()`, the engine thread's admission, prefill, first step and each chunk it "
          "hands to the audio thread, and the audio thread's rounds and sends. `bench_served.py` (patched) records each "
          "level's start on the same clock. Every server below with \"probe\" in its name ran it.", "",
          "**Where the time goes, and what changed** (call 2: the session's start, a6d0349, then this change, both "
          "with the probe, `SET=\"decoder.timestep_buckets=10,100\" LEVELS=8,64 REQUESTS=5 bash "
          "benchmarks/run_served_gpu.sh`; `raw/request_phases_thirtyfifth.json`, "
          "`raw/probe_thirtyfifth_call2.tar.xz`). Medians over each level's requests, ms:", "",
          "| phase | 8 streams: start | 8 streams: now | 64 streams: start | 64 streams: now |", "|---|---|---|---|---|"]
    for name in PHASES_35:
        md.append(f"| {name} | {ph(b, 8, name):.1f} | {ph(a, 8, name):.1f} | {ph(b, 64, name):.1f} | "
                  f"{ph(a, 64, name):.1f} |")
    md += ["",
           f"- **A request's last chunk waited.** Its audio was sent {ph(c1, 8, PHASES_35[6]):.1f}-"
           f"{ph(b, 8, PHASES_35[6]):.1f} and {ph(c1, 64, PHASES_35[6]):.1f}-{ph(b, 64, PHASES_35[6]):.1f} ms after the "
           "engine handed it over (8 and 64 streams; the two runs of the start's code, calls 1 and 2), against "
           f"{ph(c1, 8, PHASES_35[5]):.1f}-{ph(b, 8, PHASES_35[5]):.1f} and {ph(c1, 64, PHASES_35[5]):.1f}-"
           f"{ph(b, 64, PHASES_35[5]):.1f} for a middle chunk, and its end {ph(c1, 8, PHASES_35[7]):.1f}-"
           f"{ph(b, 8, PHASES_35[7]):.1f} and {ph(c1, 64, PHASES_35[7]):.1f}-{ph(b, 64, PHASES_35[7]):.1f} ms after that. "
           "Until the end, the client cannot send its next request, and its row stays empty.",
           "  - A request's chunks are 1, 4, then 16 patches. Its last chunk holds what is left when it stops: 15 "
           "or 14 patches for these 100-step requests (at 64 streams about half were 14). The VAE has graphs for 1, 4 "
           "and 16, so the last chunk decoded as six or five graph replays (4 + 4 + 4 + 1 + 1 + 1).",
           "  - Each audio round delivered every batch's audio before any request's end.",
           "- **Kept** (`engine/stream_audio.py`):",
           "  - With graphs, a request's last chunk is decoded padded with silence up to the next length with graphs "
           "(one replay of the 16-patch graph where the batch has one, up to 16 streams; a larger batch of 16-patch "
           "chunks decodes eagerly, as such batches did before), and its audio is cut back to its own patches. The "
           "decoder is causal, so those patches' audio is the same, to rounding; the state after the padding is never "
           "read, since the stream closes right after. Without graphs (the CPU) nothing is padded.",
           "  - In each batch, requests that end go first, and each gets its end right after its own audio.",
           "  - Tests: on the CPU, the padded last chunk's audio equals one decode of the whole (1e-4) and it shares "
           "a batch with chunks of its padded length, while a chunk that does not end its request, or a last chunk "
           "longer than any graph, is not padded; the order of deliveries in a round. On the GPU "
           "(`test_a_last_chunk_on_the_gpu_replays_one_padded_graph_and_gives_the_eager_decodes_audio`): one "
           "replay, the eager decode's audio. Each CPU test fails with its part of the change undone; the GPU tests "
           "passed in calls 2-4 (`raw/gpu_tests_thirtyfifth.txt`, with the stream audio and graph pieces tests).",
           f"- After it, the last chunk's audio came {ph(a, 8, 'last chunk -> its audio sent'):.1f} and "
           f"{ph(a, 64, 'last chunk -> its audio sent'):.1f} ms after it left the engine, and the end "
           f"{ph(a, 8, 'last audio sent -> end sent'):.1f} and {ph(a, 64, 'last audio sent -> end sent'):.1f} ms after "
           "its audio.",
           f"- A cost: at 8 streams a middle chunk's audio came later in all three runs with the change "
           f"({min(ph(k, 8, PHASES_35[5]) for k in (a, 'call3_graphs256', 'call3_graphs1024')):.1f}-"
           f"{max(ph(k, 8, PHASES_35[5]) for k in (a, 'call3_graphs256', 'call3_graphs1024')):.1f} ms) than in both "
           f"without ({ph(c1, 8, PHASES_35[5]):.1f}-{ph(b, 8, PHASES_35[5]):.1f}), likely because ending requests now "
           "go first in their batch, with their ends (not isolated). At 64 streams it came sooner "
           f"({ph(b, 64, PHASES_35[5]):.1f} -> {ph(a, 64, PHASES_35[5]):.1f} in call 2). Other phases moved both ways "
           f"between single servers (the decoder's queue at 64: {ph(b, 64, PHASES_35[0]):.1f} -> "
           f"{ph(a, 64, PHASES_35[0]):.1f} ms).", "",
           "**The servers** (every call ran `SET=\"decoder.timestep_buckets=10,100\" LEVELS=8,64 REQUESTS=5 bash "
           "benchmarks/run_served_gpu.sh`, one server after the other; `raw/served_thirtyfifth_*.json.gz`):", "",
           "| call | server | streams | x real time | TTFA p50 / p95 ms | smooth | steps | rows a step |",
           "|---|---|---|---|---|---|---|---|"]
    for x in servers:
        md.append(f"| {x['call']} | {x['server']} | {x['streams']} | {x['x_real_time']:.2f} | {x['ttfa_p50']:.1f} / "
                  f"{x['ttfa_p95']:.1f} | {100 * x['smooth']:.1f}% | {x['steps']:.0f} | {x['rows_per_step']:.2f} |")
    xrt = lambda call, n, tag: srv(call, n, tag)["x_real_time"]  # noqa: E731
    md += ["",
           f"- **This change** (call 2, same machine, the start first): {xrt(2, 8, 'start'):.2f} -> "
           f"{xrt(2, 8, 'padded'):.2f}x at 8 streams, {xrt(2, 64, 'start'):.2f} -> {xrt(2, 64, 'padded'):.2f}x at 64 "
           f"({xrt(2, 8, 'padded') / xrt(2, 8, 'start'):.3f}x and {xrt(2, 64, 'padded') / xrt(2, 64, 'start'):.3f}x); "
           f"decode steps {srv(2, 8, 'start')['steps']:.0f} -> {srv(2, 8, 'padded')['steps']:.0f} and "
           f"{srv(2, 64, 'start')['steps']:.0f} -> {srv(2, 64, 'padded')['steps']:.0f}. One run each, in one order: the "
           "served runs' spread between calls is 1-2%, and the phases above are what says where the gain comes "
           "from. Call 1's run of the start's code made "
           f"{xrt(1, 64, 'a6d0349'):.2f}x at 64 streams, as much as the change in call 2: the gain rests on the phases "
           "and on the later calls more than on this pair. In call 2 the start's server played 95.3% of its 64 "
           "streams smoothly (the start's code had not been served before this session); every other server of the "
           "session played all of them smoothly but call 1's before (99.4%).",
           f"- **The thirty-fourth session's channels-last VAE, served** (call 1, the probe on the new one only): "
           f"{xrt(1, 8, '0f71a82'):.2f} -> {xrt(1, 8, 'a6d0349'):.2f}x at 8 streams "
           f"({xrt(1, 8, 'a6d0349') / xrt(1, 8, '0f71a82'):.3f}x), {xrt(1, 64, '0f71a82'):.2f} -> "
           f"{xrt(1, 64, 'a6d0349'):.2f}x at 64 ({xrt(1, 64, 'a6d0349') / xrt(1, 64, '0f71a82'):.3f}x). The closed loop "
           "in process had shown 1.009x and 1.008x; one served run each, so the 64-stream figure is mostly spread "
           f"(the next call's start, the same code, made {xrt(2, 64, 'start'):.2f}x).",
           "- **Dropped: VAE graphs up to 64 x 16** (call 3: `vae_streams.MAX_GRAPH_PATCHES` 1024 against 256, both "
           "with the kept change). In call 2's probe, eager decodes (16-patch chunks of more than 16 streams) took "
           "up to 75 ms of the audio thread's time to launch, their GPU work done by the time the launches were. "
           "With graphs: "
           f"{xrt(3, 8, '64 x 16'):.2f} against {xrt(3, 8, 'padded'):.2f}x at 8 streams, {xrt(3, 64, '64 x 16'):.2f} "
           f"against {xrt(3, 64, 'padded'):.2f}x at 64 ({xrt(3, 8, '64 x 16') / xrt(3, 8, 'padded'):.3f}x, "
           f"{xrt(3, 64, '64 x 16') / xrt(3, 64, 'padded'):.3f}x), first audio p50 at 64 "
           f"{ph('call3_graphs1024', 64, 'first audio in the orchestrator'):.1f} "
           f"against {ph('call3_graphs256', 64, 'first audio in the orchestrator'):.1f} ms in the orchestrator (a "
           "first chunk queued behind one long replay waits for all of it), and the audio thread as busy "
           f"({phases['call3_graphs1024']['64']['audio_busy_s']:.2f} against "
           f"{phases['call3_graphs256']['64']['audio_busy_s']:.2f} s of a "
           f"{phases['call3_graphs256']['64']['wall_s']:.1f} s level). Reverted.",
           f"- **The final code, no probe** (call 4, `raw/served_thirtyfifth_final.{{json.gz,log.gz}}`): "
           f"{fin8['x_real_time']:.2f}x at 8 streams (TTFA p50 {fin8['ttfa_p50']:.1f} ms) and "
           f"{fin64['x_real_time']:.2f}x at 64 (TTFA p50 / p95 {fin64['ttfa_p50']:.1f} / {fin64['ttfa_p95']:.1f} ms, "
           f"{100 * fin64['smooth']:.0f}% smooth), the highest served figures so far at both levels; "
           f"{fin8['steps']:.0f} and {fin64['steps']:.0f} decode steps.", "",
           "**What is left at a request's turn** (call 2's change, 64 streams, medians): the engine reads a step "
           "after launching the next, so a newcomer's first step comes about two steps after its admission "
           f"({ph(a, 64, 'first step launched -> first chunk'):.0f} ms from launch to its first chunk); it waits "
           f"{ph(a, 64, 'submitted -> admitted'):.0f} ms for the engine's loop to take it and "
           f"{ph(a, 64, 'admitted -> prefill launched'):.0f} ms for its prefill's launch (packs of newcomers are "
           "launched one after another from the host); the audio thread spends up to about a millisecond per "
           f"response on sending ({phases[a]['64']['send_gap']['p50_ms']:.2f} ms between two sends, which also holds "
           "the ends and the waits for a batch's audio; "
           f"{phases[a]['64']['audio_sends']} sends in a {phases[a]['64']['wall_s']:.1f} s level), and a chunk that "
           "comes in during a round waits for all of it (last chunks: p90 "
           f"{phases[a]['64']['phases']['last chunk -> its audio sent']['p90_ms']:.0f} ms).", "",
           "**Targets** (issue 17): "
           f"8 streams {fin8['x_real_time']:.2f}x (target 150, missed by {100 * (1 - fin8['x_real_time'] / 150):.1f}%), "
           f"64 streams {fin64['x_real_time']:.2f}x (target 500, missed by {100 * (1 - fin64['x_real_time'] / 500):.1f}%), "
           f"{100 * fin64['smooth']:.0f}% smooth with TTFA p95 {fin64['ttfa_p95']:.0f} ms (met). Were every step full at "
           f"the same cost, the final run would make {fin8['x_real_time'] * fin8['steps'] / 500:.1f}x and "
           f"{fin64['x_real_time'] * fin64['steps'] / 500:.1f}x (upper bounds). Unchanged: one-stream RTF 0.043 "
           "(0.025, missed), TTFA p50 22.4 ms (met), capacity 128 streams with Poisson arrivals (met), served over "
           "engine about 0.8 (0.85, missed).", "",
           "![thirty-fifth session: a served request's phases; the servers](results_thirty_fifth.png)", ""]
    _plot_thirty_fifth(phases, servers)
    return md


def _plot_thirty_fifth(phases, servers):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(19, 4.6))
    names = ("submitted -> admitted", "admitted -> prefill launched", "first step launched -> first chunk",
             "first chunk -> its audio sent", "a middle chunk -> its audio sent (median per request)",
             "last chunk -> its audio sent", "last audio sent -> end sent")
    for ax, n in zip(axes[:2], (8, 64)):
        ys = range(len(names))
        for j, (key, label, color) in enumerate((("call2_before_a6d0349", "session start", "#888"),
                                                 ("call2_after_last_chunk", "last chunk padded, end first", "#286"))):
            ax.barh([y + (j - 0.5) * 0.4 for y in ys],
                    [phases[key][str(n)]["phases"][name]["p50_ms"] for name in names], 0.38, color=color, label=label)
        ax.set_yticks(list(ys), [name.replace(" (median per request)", "") for name in names], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms, median over the level's requests")
        ax.set_title(f"{n} streams, call 2", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[2]
    labels = [f"call {x['call']}, {x['server']}" for x in servers if x["streams"] == 8]
    colors = ["#bbb", "#888", "#888", "#286", "#286", "#a64", "#163"]
    for j, n in enumerate((8, 64)):
        row = [x for x in servers if x["streams"] == n]
        ax.bar([i + (j - 0.5) * 0.4 for i in range(len(row))], [x["x_real_time"] / (150 if n == 8 else 500) for x in row],
               0.38, color=colors, hatch="//" if n == 64 else None, edgecolor="k", lw=0.3)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_ylim(0.88, 1.01)
    ax.set_xticks(range(len(labels)), [str(i + 1) for i in range(len(labels))])
    ax.set_xlabel("server (left bar 8 streams, hatched 64)")
    ax.set_ylabel("x real time over the target (150x, 500x)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors]
    ax.legend(handles, [f"{i + 1}: {label}" for i, label in enumerate(labels)], fontsize=6, loc="upper left",
              bbox_to_anchor=(1.02, 1.0))
    save_panels(fig, axes, "Thirty-fifth session, NVIDIA H200, 2026-11-30: a served request's phases; the servers",
                 "results_thirty_fifth.png")
