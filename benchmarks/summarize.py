"""Build benchmarks/results.json, results.md and results.png from the raw GPU outputs in benchmarks/raw/.

    .venv/bin/python benchmarks/summarize.py [--out DIR]      (needs matplotlib for the plots)

This file makes the headline tables (main); each later session's section and its plot is
summary/sessionNN.py, run in order by SECTIONS (a new session adds a module and a line there).
tests/test_results_summary.py checks that results.md and results.json are what this makes.

Current (commands in benchmarks/README.md):
raw/offline.json      benchmarks/bench.py --reference compiled: voxcpm 2.0.3 eager and optimize(), then the engine
                      offline (CUDA graphs, compiled LocDiT/LocEnc/LM layer math, Triton attention kernels, prefill
                      graphs, step N+1 launched before step N is read), first-patch latency, kernel profiles by kind
                      at batch 1, 64 and 128
raw/served.json       benchmarks/run_served_gpu.sh (LEVELS=1,8,64): benchmarks/bench_served.py against tritonserver
                      (tts_stream, gRPC), async orchestrator, 72 decode graphs captured at start-up
raw/gpu_check.json    benchmarks/gpu_check.py
raw/startup.json      start-up phases (tritonserver log, benchmarks/startup_check.py), cold and warm
raw/startup_fixed_graphs.json  capture time and decoder start-up with the 72 decode graphs (one per batch bucket
                      and CFM loop bucket), from the served runs' tritonserver logs
raw/local_attention_s11.json, local_attention_s5.json   benchmarks/kernel_local_attention.py
raw/vae_stream_decode.json  benchmarks/bench.py --vae-only: streaming decode, eager / fused snake / CUDA graphs /
                      Triton kernels (snake_extend, dwconv_snake, skip_add; polyphase upsampling with
                      phase_interleave), with profiles and op tables
raw/polyphase_8x16.json, polyphase_64x4.json  benchmarks/kernel_vae_polyphase.py: each upsampling conv, cuDNN's
                      transposed conv vs the polyphase conv (weight row-major / channels-last)
raw/vae_fused_unit_attempt.json  a dropped attempt: the residual unit after its first snake as one Triton kernel
raw/served_final_commit.json  the sixth session's final commit, another machine
raw/served_yield_ab.json, served_noyield_ab.json  one call: the engine's per-step GIL yield on / off
raw/gpu_sharing.json  benchmarks/gpu_sharing.py: VAE calls next to a busy stand-in decoder
History (earlier code, same machine type):
raw/reference_and_run1.json  voxcpm 2.0.3 eager and optimize(); the engine before any torch.compile (run 1)
raw/offline_prev_session.json, offline_host_fill.json, offline_vae_graphs_session.json (previous session's last)
raw/served_4inst_chunks1248.json, served_prev_session.json, served_8inst_no_prefill_graphs.json,
raw/served_16inst_no_prefill_graphs.json, served_16inst_prefill_graphs.json, served_vae_graphs_run1.json,
raw/served_vae_graphs.json, served_no_vae_graphs.json (one call: VAE graphs on / off),
raw/served_local_attention.json (+ Triton LocDiT/LocEnc attention), served_vae_triton.json (+ Triton VAE conv)
raw/offline_kernels_session.json, served_trimmed_last_layer.json: the previous session's final runs
raw/served_issue17_burst.json, served_issue17_poisson.json  run_served_gpu.sh ARRIVALS=burst,poisson on the
                      eighth session's final code (prefix caching on), LEVELS=1,8,32,64,128
raw/prefix_cache.json, gateway.json  the same call: PREFIX=1 GATEWAY=1
raw/served_prefix_cache_off.json, served_prefix_cache_on_before_rows_fix.json  one call, caching off / on
raw/lora.json         benchmarks/bench_lora.py; raw/fp8_quality.json  benchmarks/fp8_quality.py --no-fp32
raw/served_h200_1gpu.json, served_h200_2gpu.json  one call on 2 x H200: one GPU, then both (KIND_AUTO)
raw/offline_overlap_before_drain.json: the step overlap before admissions
Tenth session: raw/served_tenth_final*.json (final code), served_tenth_before_fixes*.json (the same run
before), served_early_chunks_{A,B}{1,2}.json (one call, early-chunk policies in turn), served_fp8.json
(precision fp8, one stream), offline_profile_tenth.json (bench.py --batches 1,64 --graphs-only, every
kernel), startup_bursts_{before,after}.json (startup_check.py --bursts), max_autotune_partial.log
                      collected the step in flight first (first audio under bursts doubled)
raw/served_sixth_session.json: the sixth session's served run (threads + a per-instance stub lock, 16 instances)
raw/offline_overlap_session.json, served_overlap_session.json,
raw/vae_stream_decode_overlap_session.json: the fifth session's final runs (step overlap, VAE passes)
"""

import argparse
import json
import os

from summary import (
    session08, session09, session10, session11, session12, session13, session14, session15, session16,
    session17, session18, session19, session20, session21, session22, session23, session24, session25,
    session26, session27, session28, session29, session30, session31, session32, session33, session34,
    session35, session36, session37, session38, session39, session40, session41, session42, session43,
    session44, session45, session46, session47, session48, session49, session50, session51, session52,
    session53, session54, session55, session56, session57, session58, session60, session61, session62,
    session64, session65, session66, session67, session68, session69, session70, session71, session72, session73,
    session77, session78, session79, session81, session85, session86, session87, session88, session89,
)
from summary.plots import figure_path, pyplot, set_figure_dir
from summary.raw import HERE, engine_runs, layer_weights, load, model_config, served_levels, served_xrt


def step_flops(cfg: dict, timesteps: int = 10) -> dict:
    """Multiply-add FLOPs of one decode step of one request, by module, from the model config: LocDiT
    runs its CFG pair (2 x 11 tokens) once per velocity evaluation (timesteps - 1: the first is
    zero velocity), its last layer's output projection and MLP for the 4 kept tokens only; LocEnc
    encodes the new patch (5 tokens, 1 kept); the base and residual LMs take one token each."""
    lm, P = cfg["lm_config"], cfg["patch_size"]
    kv = lm["num_key_value_heads"]
    qkv, rest = layer_weights(lm["hidden_size"], lm["num_attention_heads"], kv, lm["kv_channels"],
                              lm["intermediate_size"])
    out = {"base_lm": 2 * lm["num_hidden_layers"] * (qkv + rest),
           "residual_lm": 2 * cfg["residual_lm_num_layers"] * (qkv + rest)}
    for name, sub, tokens, kept, runs in (("locdit", "dit_config", 2 * (3 + 2 * P), 2 * P, timesteps - 1),
                                          ("locenc", "encoder_config", P + 1, 1, 1)):
        c = cfg[sub]
        q, r = layer_weights(c["hidden_dim"], c["num_heads"], kv, c["kv_channels"], c["ffn_dim"])
        per_run = (c["num_layers"] - 1) * tokens * (q + r) + tokens * q + kept * r
        out[name] = 2 * runs * per_run
    return out


# Each later session's section of results.md, in order: a section may read the keys an earlier one set.
SECTIONS = (
    session08.eighth_session,
    session09.ninth_session,
    session10.tenth_session,
    session11.eleventh_session,
    session12.twelfth_session,
    session13.thirteenth_session,
    session14.fourteenth_session,
    session15.fifteenth_session,
    session16.sixteenth_session,
    session17.seventeenth_session,
    session18.eighteenth_session,
    session19.nineteenth_session,
    session20.twentieth_session,
    session21.twenty_first_session,
    session22.twenty_second_session,
    session23.twenty_third_session,
    session24.twenty_fourth_session,
    session25.twenty_fifth_session,
    session26.twenty_sixth_session,
    session27.twenty_seventh_session,
    session28.twenty_eighth_session,
    session29.twenty_ninth_session,
    session30.thirtieth_session,
    session31.thirty_first_session,
    session32.thirty_second_session,
    session33.thirty_third_session,
    session34.thirty_fourth_session,
    session35.thirty_fifth_session,
    session36.thirty_sixth_session,
    session37.thirty_seventh_session,
    session38.thirty_eighth_session,
    session39.thirty_ninth_session,
    session40.fortieth_session,
    session41.forty_first_session,
    session42.forty_second_session,
    session43.forty_third_session,
    session44.forty_fourth_session,
    session45.forty_fifth_session,
    session46.forty_sixth_session,
    session47.forty_seventh_session,
    session48.forty_eighth_session,
    session49.forty_ninth_session,
    session50.fiftieth_session,
    session51.fifty_first_session,
    session52.fifty_second_session,
    session53.fifty_third_session,
    session54.fifty_fourth_session,
    session55.fifty_fifth_session,
    session56.fifty_sixth_session,
    session57.fifty_seventh_session,
    session58.fifty_eighth_session,
    session60.sixtieth_session,
    session61.sixty_first_session,
    session62.sixty_second_session,
    session64.sixty_fourth_session,
    session65.sixty_fifth_session,
    session66.sixty_sixth_session,
    session67.sixty_seventh_session,
    session68.sixty_eighth_session,
    session69.sixty_ninth_session,
    session70.seventieth_session,
    session71.seventy_first_session,
    session72.seventy_second_session,
    session73.seventy_third_session,
    session77.seventy_seventh_session,
    session78.seventy_eighth_session,
    session79.seventy_ninth_session,
    session81.eighty_first_session,
    session85.eighty_fifth_session,
    session86.eighty_sixth_session,
    session87.eighty_seventh_session,
    session88.eighty_eighth_session,
    session89.eighty_ninth_session,
)


def main(out_dir: str = HERE):
    os.makedirs(out_dir, exist_ok=True)
    set_figure_dir(out_dir)
    off, chk, ref = load("offline.json"), load("gpu_check.json"), load("reference_and_run1.json")
    eng = off["engine"]["graphs"]
    runs = {r["batch"]: r for r in eng["runs"]}
    levels = served_levels("served.json")
    r = off.get("reference", ref["reference"])  # the reference timed in the same call as the engine
    fa = eng["first_audio"]
    res = {
        "device": off["device"],
        "date": off["date"],
        "steps_per_request": off["steps"],
        "reference_rtf_eager": min(r["eager_rtf"]),
        "reference_rtf_compiled": min(r["compiled_rtf"]),
        "reference_compile_first_call_s": r["compile_first_call_s"],
        "reference_first_session": {"rtf_eager": min(ref["reference"]["eager_rtf"]),
                                    "rtf_compiled": min(ref["reference"]["compiled_rtf"]),
                                    "compile_first_call_s": ref["reference"]["compile_first_call_s"]},
        "single_stream_rtf_triton": levels[1]["rtf"]["p50"],
        "ttfa_ms_p50": levels[1]["ttfa_ms"]["p50"],
        "ttfa_ms_p95": levels[1]["ttfa_ms"]["p95"],
        "aggregate_xrt_c64": levels[64]["x_real_time"],
        "served_final_commit_xrt_c64": served_xrt("served_final_commit.json")[64],
        "faster_than_realtime_frac_c64": levels[64]["faster_than_realtime_frac"],
        "ttfa_ms_p95_c64": levels[64]["ttfa_ms"]["p95"],
        "smooth_frac_c64": levels[64]["smooth_playback_frac"],
        "served": {c: {"ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"],
                       "rtf_p50": lv["rtf"]["p50"], "rtf_p95": lv["rtf"]["p95"],
                       "faster_than_realtime_frac": lv["faster_than_realtime_frac"],
                       "smooth_playback_frac": lv["smooth_playback_frac"], "max_gap_ms_p95": lv["max_gap_ms"]["p95"],
                       "aggregate_xrt": lv["x_real_time"], "errors": lv["errors"],
                       "server_models": lv.get("server_models", {})} for c, lv in levels.items()},
        "engine_offline": {b: {"steps_per_s": x["steps_per_s"], "rtf": x["rtf"], "aggregate_xrt": x["aggregate_xrt"]}
                           for b, x in runs.items()},
        "engine_first_patch_ms_p50": fa["first_patch_ms_p50"],
        "prefill_ms_p50": {"graph": fa.get("prefill_graph_ms_p50"), "eager": fa["prefill_eager_ms_p50"],
                           "positions": fa["prompt_positions"]},
        "load_s": off["load_s"],
        "startup_s_compile_and_capture_cold": eng["startup_s"],
        "capture_s_per_bucket": eng["capture_s_per_bucket"],
        "weights_gib": off["weights_gib"],
        "gpu_mem_peak_gib": eng.get("gpu_mem_peak_gib"),
        "gpu_check": {"bf16_vs_fp32_teacher_forced_cosine_min": chk["teacher_forced"]["cosine_min"],
                      "prefill_graph_vs_eager": chk.get("prefill_graph_vs_eager"),
                      "graph_vs_eager": chk["graph_vs_eager"],
                      "vae_graphs_vs_eager": chk["vae_graphs_vs_eager"]},
        "profile_batch1": eng["profile_batch1"],
        "profile_batch64": eng.get("profile_batch64"),
        "profile_batch128": eng["profile_batch_max"],
    }
    # history: the same measurements on earlier code
    run1 = {x["batch"]: x["aggregate_xrt"] for x in ref["engine_run1_no_compile"]["graphs"]["runs"]}
    prev = engine_runs("offline_prev_session.json")
    fill = engine_runs("offline_host_fill.json")
    last = engine_runs("offline_vae_graphs_session.json")
    kern = engine_runs("offline_kernels_session.json")
    ovl = engine_runs("offline_overlap_session.json")
    res["engine_history_xrt"] = {"graphs_only_run1": run1, "compiled_locdit_locenc": prev, "host_side_inputs": fill,
                                 "vae_graphs_session": last, "triton_attention_session": kern, "overlap_session": ovl,
                                 "now": {b: x["aggregate_xrt"] for b, x in res["engine_offline"].items()}}
    res["engine_history_ttfa_ms_p50"] = {
        "triton_attention_session": engine_runs("offline_kernels_session.json", "ttfa_ms_p50"),
        "overlap_before_drain": engine_runs("offline_overlap_before_drain.json", "ttfa_ms_p50"),
        "now": {x["batch"]: x["ttfa_ms_p50"] for x in eng["runs"]}}
    res["served_history_xrt"] = {
        "4_instances_chunks_1248": served_xrt("served_4inst_chunks1248.json"),
        "8_instances_prev_session": served_xrt("served_prev_session.json"),
        "8_instances": served_xrt("served_8inst_no_prefill_graphs.json"),
        "16_instances": served_xrt("served_16inst_no_prefill_graphs.json"),
        "prefill_graphs": served_xrt("served_16inst_prefill_graphs.json"),
        "no_vae_graphs": served_xrt("served_no_vae_graphs.json"),
        "vae_graphs_run1": served_xrt("served_vae_graphs_run1.json"),
        "vae_graphs": served_xrt("served_vae_graphs.json"),
        "triton_local_attention": served_xrt("served_local_attention.json"),
        "triton_vae_conv": served_xrt("served_vae_triton.json"),
        "trimmed_last_layer": served_xrt("served_trimmed_last_layer.json"),
        "overlap_session": served_xrt("served_overlap_session.json"),
        "sixth_session": served_xrt("served_sixth_session.json"),
        "now": {c: s["aggregate_xrt"] for c, s in res["served"].items()},
    }
    res["served_gil_yield_ab"] = {
        k: {c: {"aggregate_xrt": lv["x_real_time"], "ttfa_ms_p50": lv["ttfa_ms"]["p50"], "ttfa_ms_p95": lv["ttfa_ms"]["p95"]}
            for c, lv in served_levels(f).items()}
        for k, f in (("yield", "served_yield_ab.json"), ("no_yield", "served_noyield_ab.json"))}
    vae = load("vae_stream_decode.json")
    vae_modes = ("eager", "compiled", "graphs", "triton", "triton_graphs")
    res["vae_stream_decode_ms"] = {m: {f"{x['streams']}x{x['patches']}": x["ms"] for x in vae[m]} for m in vae_modes}
    res["vae_graphs_capture_s"], res["vae_graphs_mem_gib"] = vae["capture_s"], vae["graph_mem_gib"]
    res["vae_profile_8x16"] = {m: vae[f"profile_8x16_{m}"] for m in ("compiled", "triton")}
    vae_rate = next(x["audio_s_per_s"] for x in vae["triton_graphs"] if (x["streams"], x["patches"]) == (8, 16))
    res["vae_stream_decode_ms_overlap_session"] = {
        f"{x['streams']}x{x['patches']}": x["ms"] for x in load("vae_stream_decode_overlap_session.json")["triton_graphs"]}
    res["polyphase_us"] = {k: load(f"polyphase_{k}.json")["rows"] for k in ("8x16", "64x4")}
    res["vae_fused_unit_attempt_triton_graphs_ms"] = {
        f"{x['streams']}x{x['patches']}": x["ms"] for x in load("vae_fused_unit_attempt.json")["triton_graphs"]}
    res["local_attention_us"] = {s_: load(f"local_attention_s{s_}.json")["rows"] for s_ in (11, 5)}
    st = load("startup.json")
    res["startup"] = st
    fixed = res["startup_fixed_graphs"] = load("startup_fixed_graphs.json")
    res["gpu_sharing_vae_ms_p50"] = {k: {s: x["p50_ms"] for s, x in v.items()}
                                     for k, v in load("gpu_sharing.json").items() if k != "device"}

    md = [f"# Results: {res['device']}, {res['date']}", "",
          f"Full-size random VoxCPM2 weights (bf16), {res['steps_per_request']} decode steps per request "
          f"(MIN_LENGTH = MAX_LENGTH, 16 s of audio), 10 CFM timesteps, CFG 2.0.", "",
          "| | measured | target |", "|---|---|---|",
          f"| single-stream RTF through Triton | **{res['single_stream_rtf_triton']:.3f}** | <= 0.025 |",
          f"| time to first audio, p50 (served, 1 stream) | **{res['ttfa_ms_p50']:.0f} ms** | <= 50 ms |",
          f"| aggregate x real time, 64 streams (served) | **{res['aggregate_xrt_c64']:.0f}x**, "
          f"{100 * res['faster_than_realtime_frac_c64']:.0f}% of streams faster than real time ("
          f"{res['served_history_xrt']['sixth_session'][64]:.0f}x with the sixth session's threaded orchestrator) "
          "| >= 600x |",
          f"| 64 streams (served, all at once): smooth playback / first audio p95 | "
          f"**{100 * res['smooth_frac_c64']:.0f}% / {res['ttfa_ms_p95_c64']:.0f} ms** ("
          f"{100 * load('served_sixth_session.json')['levels'][-1]['smooth_playback_frac']:.0f}% / "
          f"{load('served_sixth_session.json')['levels'][-1]['ttfa_ms']['p95']:.0f} ms before) | 100% / <= 300 ms |",
          f"| start-up, served decoder on a fresh machine (load + compile + capture) | "
          f"**{res['startup']['served_decoder_ready_s_cold']['fresh_machine_1']['total']:.0f} and "
          f"{res['startup']['served_decoder_ready_s_cold']['fresh_machine_2']['total']:.0f} s** with one CFM loop "
          f"length's 8 graphs; **{fixed['runs'][-2]['decoder_ready_s']:.0f} and {fixed['runs'][-1]['decoder_ready_s']:.0f} "
          f"s** with all {fixed['decode_graphs']} (every INFERENCE_TIMESTEPS) | <= 90 s |", "",
          "| system | single-stream RTF | notes |", "|---|---|---|",
          f"| voxcpm 2.0.3 eager | {res['reference_rtf_eager']:.3f} | same call as the engine rows; "
          f"{res['reference_first_session']['rtf_eager']:.2f} in the first session's call |",
          f"| voxcpm 2.0.3 `optimize()` | {res['reference_rtf_compiled']:.3f} | first call compiles for "
          f"{res['reference_compile_first_call_s']:.0f} s; {res['reference_first_session']['rtf_compiled']:.3f} in "
          "the first session's call (another machine) |",
          f"| this engine, offline | {runs[1]['rtf']:.3f} | {runs[1]['steps_per_s']:.0f} steps/s; first patch "
          f"{res['engine_first_patch_ms_p50']:.1f} ms |",
          f"| **through Triton** (`tts_stream`, gRPC) | **{res['single_stream_rtf_triton']:.3f}** | "
          f"TTFA p50 {res['ttfa_ms_p50']:.0f} ms |", "",
          "Served (`benchmarks/run_served_gpu.sh`: concurrent gRPC streams on `tts_stream`, default config: 4",
          "tts_stream instances on `async def execute`, chunks of 1, 4, then 16 patches, decoder max batch 64; "
          "smooth: no underrun for a player that starts at the first chunk):", "",
          "| streams | TTFA p50 / p95 ms | per-stream RTF p50 / p95 | faster than real time | smooth | aggregate x "
          "real time | vae_decoder: requests per execute, ms per execute, time busy |", "|---|---|---|---|---|---|---|"]
    for c, s in res["served"].items():
        v = s["server_models"].get("vae_decoder", {})
        md.append(f"| {c} | {s['ttfa_ms_p50']:.0f} / {s['ttfa_ms_p95']:.0f} | {s['rtf_p50']:.3f} / {s['rtf_p95']:.3f} "
                  f"| {100 * s['faster_than_realtime_frac']:.0f}% | {100 * s['smooth_playback_frac']:.0f}% "
                  f"| {s['aggregate_xrt']:.1f} | "
                  f"{v.get('batch_mean', 0):.1f}, {v.get('infer_ms_per_execution', 0):.1f} ms, "
                  f"{100 * v.get('busy_frac', 0):.0f}% |")
    md += ["", "Engine alone (`benchmarks/bench.py`):", "",
           "| batch | steps/s | RTF | aggregate x real time |", "|---|---|---|---|"]
    md += [f"| {b} | {x['steps_per_s']:.1f} | {x['rtf']:.3f} | {x['aggregate_xrt']:.1f} |"
           for b, x in res["engine_offline"].items()]
    p = res["prefill_ms_p50"]
    md += ["", f"A lone request's first latent patch: {res['engine_first_patch_ms_p50']:.1f} ms after submit "
           f"(prefill of {p['positions']} positions: {p['graph']:.1f} ms as a CUDA graph, {p['eager']:.1f} ms eager).",
           "", "How the engine got here (aggregate x real time by batch):", "",
           "| batch | graphs only | + compiled LocDiT/LocEnc | + host-side inputs | + VAE graphs session | "
           "+ Triton LocDiT/LocEnc attention, last layer trimmed | + step N+1 launched before step N is read | "
           "now (same engine code, another machine) |",
           "|---|---|---|---|---|---|---|---|"]
    h = res["engine_history_xrt"]
    for b in sorted(h["now"]):
        cells = [h[k].get(b) for k in ("graphs_only_run1", "compiled_locdit_locenc", "host_side_inputs",
                                       "vae_graphs_session", "triton_attention_session", "overlap_session", "now")]
        md.append(f"| {b} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in cells) + " |")
    ht = res["engine_history_ttfa_ms_p50"]
    md += ["", "First audio of a burst (all requests submitted at once; ms from the first submit to each request's "
           "first patch, p50). Overlapping the steps first made admissions wait for the next prefill too; admissions "
           "now collect the step in flight first, and the engine thread yields the GIL once per step so that "
           "submitters are not held for the interpreter's 5 ms switch interval. Up to 64 that brings it back to "
           "where it was; at 128 (the largest bucket; the served decoder runs at most 64) it is still twice the old "
           "value, which is not explained yet:", "",
           "| batch | before the overlap | overlap, first version | now |", "|---|---|---|---|"]
    md += [f"| {b} | {ht['triton_attention_session'][b]:.0f} | {ht['overlap_before_drain'][b]:.0f} | {ht['now'][b]:.0f} |"
           for b in sorted(ht["now"])]
    md += ["", "Served, step by step (aggregate x real time; each column one device call, and calls on different "
           "machines of the same type differ by up to 20% at 64 streams, so compare within a call where noted):", "",
           "| streams | 4 inst., chunks 1,2,4,8 | 8 inst. | 16 inst. | + prefill graphs | + VAE graphs | same call, "
           "VAE graphs off | + Triton LocDiT/LocEnc attention | + Triton VAE conv | + trimmed last layer | + step "
           "overlap, VAE snake_extend / skip_add | + VAE polyphase upsampling | now: async orchestrator, 4 inst., "
           "decode graphs per CFM loop length |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    sh = res["served_history_xrt"]
    for c in sorted(sh["now"]):
        md.append(f"| {c} | " + " | ".join(f"{sh[k].get(c, float('nan')):.0f}" for k in
                                           ("4_instances_chunks_1248", "8_instances", "16_instances", "prefill_graphs",
                                            "vae_graphs", "no_vae_graphs", "triton_local_attention",
                                            "triton_vae_conv", "trimmed_last_layer", "overlap_session",
                                            "sixth_session", "now"))
                  + " |")
    ab = res["served_gil_yield_ab"]
    md += ["", "One call, another machine, the engine's per-step GIL yield on and off (aggregate x real time; TTFA "
           "p50 / p95 ms): " + "; ".join(
               f"{c} streams: {ab['yield'][c]['aggregate_xrt']:.0f}x, {ab['yield'][c]['ttfa_ms_p50']:.0f} / "
               f"{ab['yield'][c]['ttfa_ms_p95']:.0f} with, {ab['no_yield'][c]['aggregate_xrt']:.0f}x, "
               f"{ab['no_yield'][c]['ttfa_ms_p50']:.0f} / {ab['no_yield'][c]['ttfa_ms_p95']:.0f} without"
               for c in sorted(ab["yield"]))
           + ". Within noise served (Triton's execute threads submit); it is kept for in-process callers such as "
           "`bench.py`, whose burst of 32 and 64 requests reached first audio in 140 and 158 ms with it and 176 and "
           "264 ms without (two runs, one each)."]
    v = res["vae_stream_decode_ms"]
    md += ["", "Streaming VAE decode as vae_decoder runs it (`VAEStreams.decode`: gather state, decode, scatter, "
           "audio to the host), ms per call, GPU to itself (streams x patches, fp32). Graphs are captured up to "
           f"{256} patches per replay ({res['vae_graphs_capture_s']:.1f} s, {res['vae_graphs_mem_gib']:.2f} GiB); "
           "above that the decode is bound by the GPU's work and runs eagerly. The eager columns at small sizes are "
           "bound by launches on the host (a Triton launch costs more CPU than a PyTorch op), which the graphs remove:",
           "",
           "| streams x patches | eager | fused snake | CUDA graph | + Triton conv, eager | + Triton conv, "
           "CUDA graph (served) |", "|---|---|---|---|---|---|"]
    md += [f"| {k} | " + " | ".join(f"{v[m][k]:.1f}" for m in vae_modes) + " |" for k in v["eager"]]
    vp = res["vae_profile_8x16"]
    md += ["", "Where an 8-stream x 16-patch VAE call goes (ms of GPU time, eager): " + "; ".join(
        f"{m}: {vp[m]['gpu_ms']:.1f} ms in {vp[m]['kernels']:.0f} kernels ("
        + ", ".join(f"{k} {x:.1f}" for k, x in vp[m]["by_kind_ms"].items()) + ")" for m in vp)
        + ". PyTorch runs fp32 depthwise convs on its generic kernel (5.0 ms in the compiled column); "
        "`kernels.vae.dwconv_snake` does the conv, bias and the next snake in one pass, `snake_extend` writes the "
        "first snake behind the stream's saved frames (no torch.cat), and `skip_add` adds the pointwise conv's bias "
        "with the skip (cuDNN adds a conv's bias in a broadcast pass of its own). The upsampling convs run in "
        "polyphase form (below). What is left, by PyTorch op (ms, Triton column): "
        + ", ".join(f"{o['op'].removeprefix('aten::')} {o['shapes'][:40]} {o['self_cuda_ms']:.2f}"
                    for o in vp["triton"].get("top_ops", [])[:5]) + "."]
    vo, va = res["vae_stream_decode_ms_overlap_session"], res["vae_fused_unit_attempt_triton_graphs_ms"]
    md += ["", "The upsampling ConvTranspose1d (kernel 2s, stride s) as a 2-tap conv with s x C_out output channels, "
           "then `kernels.vae.phase_interleave` (phase j of frame t to sample t x s + j, plus the bias). cuDNN ran "
           "the widest transposed conv on a generic fp32 engine. us per call (`benchmarks/kernel_vae_polyphase.py`); "
           "the weight is kept channels-last from 512 input channels up, row-major below (the faster of the two "
           "columns):", "", "| streams x patches | level | C_in | transposed conv | polyphase, row-major weight | "
           "polyphase, channels-last weight | polyphase as served |", "|---|---|---|---|---|---|---|"]
    md += [f"| {k} | {r_['level']} | {r_['channels_in']} | {r_['conv_transpose_us']:.0f} | "
           f"{r_['polyphase_row_major_weight_us']:.0f} | {r_['polyphase_channels_last_weight_us']:.0f} | "
           f"**{r_['polyphase_us']:.0f}** |" for k, rows in res["polyphase_us"].items() for r_ in rows]
    md += ["", "Whole VAE call as served (Triton kernels, CUDA graph), ms: " + ", ".join(
        f"{k} {vo[k]:.2f} -> {v['triton_graphs'][k]:.2f}" for k in ("1x1", "8x4", "8x16", "64x4")) + " (fifth session's "
        "final run -> now). Tried and dropped: the whole residual unit after its first snake as one Triton kernel "
        "(depthwise conv, snake, pointwise conv by tl.dot in TF32, bias, skip). Per shape its best block sizes only "
        "matched the three-kernel unit (it recomputes the depthwise conv per output-channel block, and its seven "
        "shifted tap loads are not vectorised), and at the default sizes the decode got slower: 8x16 "
        f"{va['8x16']:.1f} ms, 64x4 {va['64x4']:.1f} ms (`raw/vae_fused_unit_attempt*.json`)."]
    la = res["local_attention_us"]
    md += ["", "LocDiT (11 tokens) and LocEnc (5 tokens) attention per layer call, us from a CUDA graph "
           "(`benchmarks/kernel_local_attention.py`; the PyTorch path compiled: RoPE, head folding, "
           "flash SDPA, unfolding):", "", "| tokens | batch | PyTorch, compiled | Triton kernel (4 heads per program) |",
           "|---|---|---|---|"]
    md += [f"| {s_} | {r_['batch']} | {r_['torch_compiled_us']:.1f} | {r_['fused_h4_us']:.1f} |"
           for s_, rows in la.items() for r_ in rows]
    gs = res["gpu_sharing_vae_ms_p50"]
    md += ["", "The same VAE graph calls next to a busy decoder (`benchmarks/gpu_sharing.py`: a stand-in CUDA graph of "
           "GEMMs replayed back to back, as the engine's steps are), ms p50. Triton runs each Python model in its own "
           "process, so the two share the GPU by time-slicing; the same process on two streams fares no better once "
           "the load fills the GPU:", "",
           "| VAE call | alone | 10 ms steps, other process | same process | 25 ms steps, other process | same process |",
           "|---|---|---|---|---|---|"]
    md += [f"| {k} | " + " | ".join(f"{gs[c][k]:.1f}" for c in ("vae_alone", "other_process_10ms", "same_process_10ms",
                                                                   "other_process_25ms", "same_process_25ms")) + " |"
           for k in gs["vae_alone"]]
    g = res["gpu_check"]
    worst_cos = min(x["compiled_vs_plain_cosine_min"] for x in g["graph_vs_eager"].values())
    worst_abs = max(x["max_abs"] for x in g["graph_vs_eager"].values())
    pf = g["prefill_graph_vs_eager"]
    gpu_bound = 1 / (1 / runs[64]["aggregate_xrt"] + 1 / vae_rate)
    flops = step_flops(model_config())
    p64, audio_per_step = res["profile_batch64"], 0.16  # 4 latent frames at 25 Hz
    gemm64 = p64["by_kind_ms"]["GEMM (cuBLAS)"]
    tflops64 = 64 * sum(flops.values()) / (gemm64 / 1000) / 1e12
    gemm_only = 64 * audio_per_step / (gemm64 / 1000)
    res["roofline"] = {"gflop_per_request_step": {k: v / 1e9 for k, v in flops.items()},
                       "gemm_tflops_at_batch64": tflops64, "engine_xrt_if_gemms_were_all_at_batch64": gemm_only,
                       "served_xrt_bound_with_that_engine_and_the_vae": 1 / (1 / gemm_only + 1 / vae_rate)}
    md += ["", f"Why 64 served streams stop near {res['aggregate_xrt_c64']:.0f}x: the decoder and the VAE decoder share "
           f"the GPU. The engine alone makes {runs[64]['aggregate_xrt']:.0f}x at batch 64 and the VAE alone "
           f"{vae_rate:.0f}x (8 streams x 16 patches as a graph), so with their GPU work done one after the other "
           f"the bound is {gpu_bound:.0f}x; served reaches {100 * res['aggregate_xrt_c64'] / gpu_bound:.0f}% of it "
           "(the rest goes to time-slicing between the two processes, prefills and the small first chunks). Past this it takes faster kernels, not "
           "scheduling.",
           "", "How far 600x is from what the GPU can do: a decode step of one request is "
           f"{sum(flops.values()) / 1e9:.0f} GFLOP of matrix products, {flops['locdit'] / 1e9:.0f} of them LocDiT's "
           "(9 velocity evaluations of 12 layers over 2 x 11 tokens; base LM "
           f"{flops['base_lm'] / 1e9:.1f}, residual LM {flops['residual_lm'] / 1e9:.1f}, LocEnc "
           f"{flops['locenc'] / 1e9:.1f}). At batch 64 cuBLAS does them in {gemm64:.1f} ms per step, "
           f"{tflops64:.0f} TFLOP/s. If those GEMMs were all the engine did, it would make {gemm_only:.0f}x; with the "
           f"VAE's {vae_rate:.0f}x on the same GPU that bounds the served path at "
           f"{res['roofline']['served_xrt_bound_with_that_engine_and_the_vae']:.0f}x. 600x served at 64 streams so "
           "needs every non-GEMM kernel of the step gone and no sharing overhead, or GEMMs well past 500 TFLOP/s in "
           "bf16: it is at the edge of one H100."]
    sc = st["served_decoder_ready_s_cold"]
    md += ["", "Start-up of the served decoder, load + compile + capture ('decoder ready in' in the tritonserver log): "
           + " and ".join(f"{x['total']:.0f} s (load {x['load']:.0f} s, decode-step graphs {x['decode_graphs']:.0f} s)"
                          for x in sc.values())
           + f" on fresh machines (no compile caches); {st['served_decoder_ready_s_warm_compile_cache']['total']:.0f} s "
           "with the compile cache kept (docker-compose keeps it on a volume). The previous session measured "
           f"{st['before_this_session']['served_decoder_compile_and_capture_s']['cold_run1_fresh_machine']:.0f}-"
           f"{st['before_this_session']['served_decoder_compile_and_capture_s']['cold_run2_fresh_machine']:.0f} s for "
           "compile + capture alone. What changed: smaller compiled graphs (the Triton attention op), and no "
           "recompiles (`TORCH_LOGS=recompiles python benchmarks/startup_check.py`): views passed to compiled code, "
           "LocEnc's two layouts and RoPE tables moved during the first trace each compiled something twice.",
           "", f"Offline engine (cold compile cache): load {res['load_s']:.1f} s, compile + capture "
           f"{res['startup_s_compile_and_capture_cold']:.0f} s; weights {res['weights_gib']:.2f} GiB, peak "
           f"{res['gpu_mem_peak_gib']:.1f} GiB (incl. an 8 GiB KV pool); the served decoder peaks at 22 GiB "
           "(25% of free memory for its KV pool).",
           "", f"GPU checks: bf16 vs fp32 teacher-forced over 50 steps, patch cosine min "
           f"{g['bf16_vs_fp32_teacher_forced_cosine_min']:.4f} (>= 0.99); graph replay vs eager, max abs "
           f"{worst_abs:.1e} (<= 1e-2); compiled step with the Triton kernels vs plain eager step with PyTorch "
           f"attention, cosine min {worst_cos:.4f} (>= 0.99); "
           + (f"prefill graph vs eager, cosine min {pf['cosine_min']:.5f}; " if pf else "")
           + f"VAE graphs vs the same decoder eagerly, max abs {g['vae_graphs_vs_eager']['graph_vs_eager_max_abs']:.1e} "
           f"(<= 1e-4); served VAE vs exact fp32 (TF32 off) "
           f"{g['vae_graphs_vs_eager']['served_vs_exact_fp32_max_abs']:.1e}, where PyTorch's default (TF32 in cuDNN) "
           f"is {g['vae_graphs_vs_eager']['plain_vs_exact_fp32_max_abs']:.1e} from it (bound "
           f"{g['vae_graphs_vs_eager']['served_bound']:.0e}; served vs plain eager "
           f"{g['vae_graphs_vs_eager']['served_vs_plain_max_abs']:.1e}, the compiled snakes alone "
           f"{g['vae_graphs_vs_eager']['compiled_snakes_vs_plain_max_abs']:.1e} on this random full-size decoder).", ""]
    for b, prof in ((1, res["profile_batch1"]), (64, res["profile_batch64"]), (128, res["profile_batch128"])):
        md += [f"Where a batch-{b} step goes: {prof['gpu_ms']:.2f} ms of GPU work in {prof['kernels']:.0f} kernels per "
               f"step, of {prof['wall_ms_per_step']:.2f} ms per step while profiled: " + ", ".join(
                   f"{k} {x:.2f}" for k, x in prof["by_kind_ms"].items()) + ". Top kernels (ms per step):", ""]
        md += [f"- {k['cuda_ms']:.2f} ms  {k['kernel'][:80]}" for k in prof["top"][:6]]
        md.append("")
    # results.png is this run's (the sixth session's H100) overview: later sections replace the headline keys
    plotted_rtf = [res["reference_rtf_eager"], res["reference_rtf_compiled"], runs[1]["rtf"],
                   res["single_stream_rtf_triton"]]
    for section in SECTIONS:
        md += section(res)
    targets = res.pop("_issue17_targets")
    h100 = [(k.replace("_", "-"), v) for k, v in res.items() if isinstance(v, dict) and "H100" in str(v.get("device"))]
    served_at, served = next((k, v) for k, v in reversed(h100) if "served_ttfa_p95_ms_c64" in v)
    ratio_at, ratio = next((k, v["served_over_engine_c64"]) for k, v in reversed(h100) if "served_over_engine_c64" in v)
    md[2:2] = [f"**Latest served headline** ({res['served_headline_source']}): one stream RTF "
               f"{res['single_stream_rtf_triton']:.4f}, TTFA p50 {res['ttfa_ms_p50']:.1f} ms; 64 streams at once "
               f"{res['aggregate_xrt_c64']:.1f}x, {100 * res['smooth_frac_c64']:.0f}% smooth, TTFA p95 "
               f"{res['ttfa_ms_p95_c64']:.0f} ms; 128 streams {res['aggregate_xrt_c128']:.1f}x; capacity "
               f"{res['capacity_streams']['burst']} (burst) / {res['capacity_streams']['poisson']} (Poisson).", "",
               "**Issue 17's targets** (the seventy-first session's table, on H200s; no later session changed a figure "
               f"in it. The latest H100 figures of its rows: the {served_at} session's one stream RTF "
               f"{served['served_rtf_p50_c1']:.4f}, TTFA p50 {served['served_ttfa_p50_ms_c1']:.1f} ms, 64 streams "
               f"{served['served_xrt_c64']:.1f}x, {100 * served['served_smooth_c64']:.0f}% smooth, TTFA p95 "
               f"{served['served_ttfa_p95_ms_c64']:.0f} ms; the {ratio_at} session's served over engine at 64, "
               f"{ratio:.3f}):", "",
               *targets("the seventy-first session"), "",
               "The tables after it are the sixth session's H100 run; the sessions follow in order.", ""]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    plt = pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style, label in (("graphs_only_run1", "s:", "engine, graphs only"),
                              ("overlap_session", "D--", "engine, fifth session"),
                              ("now", "o-", "engine, sixth session")):
        xs = sorted(h[key])
        a.plot(xs, [h[key][x] for x in xs], style, label=label)
    for key, style, label in (("vae_graphs", "v:", "served, third session"),
                              ("overlap_session", "x--", "served, fifth session"),
                              ("now", "^-", "served (tts_stream), sixth session")):
        xs = sorted(sh[key])
        a.plot(xs, [sh[key][x] for x in xs], style, label=label)
    a.axhline(600, color="#c33", lw=0.8, ls="--", label="target at 64 streams")
    a.set_xscale("log", base=2)
    a.set_xlabel("concurrent requests")
    a.set_ylabel("aggregate x real time")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    names = ["voxcpm eager", "voxcpm optimize()", "engine offline", "Triton tts_stream"]
    vals = plotted_rtf
    b.bar(names, vals, color=["#999", "#777", "#4a8", "#286"])
    b.axhline(0.025, color="#c33", lw=0.8, ls="--")
    b.set_yscale("log")
    b.set_ylabel("single-stream RTF (lower is better)")
    for i, v_ in enumerate(vals):
        b.text(i, v_, f"{v_:.3f}", ha="center", va="bottom")
    b.tick_params(axis="x", rotation=15)
    fig.suptitle(f"VoxCPM2 on {res['device']} ({res['date']})")
    fig.tight_layout()
    fig.savefig(figure_path("results.png"), dpi=110)
    print("\n".join(md))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="results.json, results.md and the plots from benchmarks/raw/")
    parser.add_argument("--out", default=HERE, help="where they are written (default: benchmarks/)")
    main(parser.parse_args().out)
