"""voxcpm-tts / python -m voxcpm_client: synthesize one text to a wav file."""
from __future__ import annotations

import argparse
import sys

from .client import VoxCPMClientError, load_audio, synthesize, synthesize_stream

DEFAULTS = {"grpc": ("localhost:8001", "tts_stream"), "http": ("localhost:8000", "tts")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="voxcpm-tts", description="VoxCPM2 text-to-speech through Triton.")
    p.add_argument("text", help="text to speak; a leading '(description)' is voice design")
    p.add_argument("-o", "--output", default="out.wav", help="wav file to write (default out.wav)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc",
                   help="grpc: streaming (tts_stream); http: whole utterance (tts)")
    p.add_argument("--url", help="host:port (default localhost:8001 for grpc, localhost:8000 for http)")
    p.add_argument("--model", help="model name (default tts_stream for grpc, tts for http)")
    p.add_argument("--reference", metavar="WAV", help="reference audio for voice cloning")
    p.add_argument("--prompt-audio", metavar="WAV", help="audio to continue from (needs --prompt-text)")
    p.add_argument("--prompt-text", help="transcript of --prompt-audio")
    p.add_argument("--cfg", type=float, dest="cfg_value", help="classifier-free guidance (server default 2.0)")
    p.add_argument("--timesteps", type=int, dest="inference_timesteps", help="CFM steps (server default 10)")
    p.add_argument("--min-length", type=int, help="min decode steps")
    p.add_argument("--max-length", type=int, help="max decode steps")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--float", action="store_true", help="write 32-bit float wav instead of 16-bit PCM")
    args = p.parse_args(argv)
    if (args.prompt_audio is None) != (args.prompt_text is None):
        p.error("--prompt-audio and --prompt-text go together")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    url, model = DEFAULTS[args.protocol]
    url, model = args.url or url, args.model or model
    params = {k: getattr(args, k) for k in ("cfg_value", "inference_timesteps", "min_length", "max_length", "seed")}
    try:
        if args.reference:
            params["reference_audio"], params["reference_sample_rate"] = load_audio(args.reference)
        if args.prompt_audio:
            params["prompt_audio"], params["prompt_sample_rate"] = load_audio(args.prompt_audio)
            params["prompt_text"] = args.prompt_text
    except Exception as exc:  # unreadable audio file
        print(f"error: cannot read audio: {exc}", file=sys.stderr)
        return 2
    fn = synthesize_stream if args.protocol == "grpc" else synthesize
    try:
        result = fn(args.text, url=url, model=model, timeout=args.timeout, **params)
    except VoxCPMClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if result.ttfa_s is not None:
        print(f"time to first audio: {result.ttfa_s:.3f} s")
    print(f"total time: {result.total_s:.3f} s")
    print(f"audio: {result.audio_s:.3f} s")
    print(f"RTF: {result.rtf:.3f}")
    if result.sample_rate <= 0:
        print("error: server returned no SAMPLE_RATE", file=sys.stderr)
        return 2
    result.save(args.output, subtype="FLOAT" if args.float else "PCM_16")
    print(f"wrote {args.output} ({result.sample_rate} Hz)")
    return 0
