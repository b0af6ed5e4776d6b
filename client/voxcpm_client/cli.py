"""voxcpm-tts / python -m voxcpm_client: synthesize one text to a wav file; `voices ...` manages
the server's stored voices (add NAME WAV [--text T] [--lora L], list, remove NAME), `loras ...` its
LoRA adapters (add NAME, list, remove NAME)."""
from __future__ import annotations

import argparse
import functools
import os
import sys

from .client import (VOICE_MODES, VoxCPMClientError, add_lora, add_voice, input_arrays, list_loras, list_voices,
                     load_audio, remove_lora, remove_voice, server_address, synthesize, synthesize_stream)

MODELS = {"grpc": "tts_stream", "http": "tts"}
# Without --url: localhost, at the port scripts/serve.sh serves the protocol on (its variable where set, as for it)
PORTS = {"grpc": ("TRITON_GRPC_PORT", "8001"), "http": ("TRITON_HTTP_PORT", "8000")}
URL_HELP = ("host:port (default: localhost at $TRITON_GRPC_PORT, else 8001, for grpc; at $TRITON_HTTP_PORT, else "
            "8000, for http)")
MAX_TIMEOUT_S = 10 * 24 * 3600.0  # gRPC's deadline overflows far past this; a day-long request is a mistake anyway


def address(text: str) -> str:
    """--url: host:port."""
    try:
        return server_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def server_url(args) -> str | None:
    """--url, else localhost at the protocol's port (PORTS); None, said on stderr, if its variable is no port."""
    if args.url:
        return args.url
    var, port = PORTS[args.protocol]
    value = os.environ.get(var, "").strip() or port
    try:
        return server_address(f"localhost:{value}")
    except ValueError:
        print(f"error: {var}={value!r} is not a port (1-65535); give --url host:port", file=sys.stderr)
        return None


def seconds(text: str) -> float:
    """--timeout: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT_S:  # (NaN fails too)
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_TIMEOUT_S:.0f} seconds, got {text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="voxcpm-tts", description="VoxCPM2 text-to-speech through Triton.",
                                epilog="Stored voices: voxcpm-tts voices {add,list,remove} --help; LoRA adapters: "
                                       "voxcpm-tts loras {add,list,remove} --help")
    p.add_argument("text", help="text to speak; a leading '(description)' is voice design")
    p.add_argument("-o", "--output", default="out.wav", help="wav file to write (default out.wav)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc",
                   help="grpc: streaming (tts_stream); http: whole utterance (tts)")
    p.add_argument("--url", type=address, help=URL_HELP)
    p.add_argument("--model", help="model name (default tts_stream for grpc, tts for http)")
    p.add_argument("--reference", metavar="WAV", help="reference audio for voice cloning")
    p.add_argument("--prompt-audio", metavar="WAV", help="audio to continue from (needs --prompt-text)")
    p.add_argument("--prompt-text", help="transcript of --prompt-audio")
    p.add_argument("--voice", help="a stored voice (see `voices add`) instead of the audio")
    p.add_argument("--voice-mode", choices=VOICE_MODES,
                   help="the stored voice as reference (server default), continuation (as prompt audio + "
                        "text; needs a voice added with --text) or both")
    p.add_argument("--cfg", type=float, dest="cfg_value", help="classifier-free guidance (server default 2.0)")
    p.add_argument("--timesteps", type=int, dest="inference_timesteps", help="CFM steps (server default 10)")
    p.add_argument("--min-length", type=int, help="min decode steps")
    p.add_argument("--max-length", type=int, help="max decode steps")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--normalize", action="store_true", default=None,
                   help="write numbers, dates, currencies, units... in the text out as words first (server-side)")
    p.add_argument("--no-retry-badcase", dest="retry_badcase", action="store_false", default=None,
                   help="model tts only (--protocol http, or --model tts): keep the first try even if it runs far too long for its text (the server "
                        "tries again by default, 3 tries in all)")
    p.add_argument("--lora", help="a LoRA adapter the server has loaded (see `voxcpm-tts loras list`); default: the "
                                  "--voice's default adapter, if it has one; '': the base model")
    p.add_argument("--timeout", type=seconds, default=600.0, help="seconds (default 600)")
    p.add_argument("--float", action="store_true", help="write 32-bit float wav instead of 16-bit PCM")
    args = p.parse_args(argv)
    if (args.prompt_audio is None) != (args.prompt_text is None):
        p.error("--prompt-audio and --prompt-text go together")
    if args.voice_mode and not args.voice:
        p.error("--voice-mode needs --voice")
    if not args.output.lower().endswith(".wav"):
        p.error(f"-o/--output must name a .wav file (what this writes), got {args.output!r}")
    if args.retry_badcase is not None and (args.model or MODELS[args.protocol]) == "tts_stream":
        p.error("--no-retry-badcase is for tts (--protocol http, or --model tts): tts_stream's audio, once sent, "
                "cannot be taken back")
    return args


def _registry_parser(prog: str, description: str):
    """A parser for a registry model's actions; returns it and the subparsers' parent holding the
    connection options (given before or after the action; after, they win)."""
    def common(parser, default):
        d = (lambda v: v) if default else (lambda v: argparse.SUPPRESS)
        parser.add_argument("--protocol", choices=("grpc", "http"), default=d("grpc"))
        parser.add_argument("--url", type=address, default=d(None), help=URL_HELP)
        parser.add_argument("--timeout", type=seconds, default=d(120.0), help="seconds (default 120)")

    p = argparse.ArgumentParser(prog=prog, description=description)
    common(p, True)
    shared = argparse.ArgumentParser(add_help=False)
    common(shared, False)
    return p, shared


def parse_voices_args(argv):
    p, shared = _registry_parser("voxcpm-tts voices", "The server's stored voices (model `voices`).")
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", parents=[shared], help="store a wav file as a voice (replaces one of that name)")
    add.add_argument("name", help="1-64 characters of A-Z a-z 0-9 _ . -, not starting with '.'")
    add.add_argument("audio", metavar="WAV")
    add.add_argument("--text", help="transcript of the audio: lets the voice serve --voice-mode continuation/both")
    add.add_argument("--lora", help="the voice's default LoRA adapter (loaded on the server): used when a request "
                                    "with the voice names no --lora")
    sub.add_parser("list", parents=[shared], help="the stored voices' names")
    rm = sub.add_parser("remove", parents=[shared], help="remove a voice")
    rm.add_argument("name")
    return p.parse_args(argv)


def parse_loras_args(argv):
    p, shared = _registry_parser("voxcpm-tts loras", "The decoder's LoRA adapters while it serves (model `loras`).")
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", parents=[shared], help="load an adapter from the server's LoRA folder (replaces a "
                                                       "loaded one of that name)")
    add.add_argument("name", help="the adapter's subfolder of the server's LoRA folder (lora_dir, VOXCPM_LORA_DIR)")
    sub.add_parser("list", parents=[shared], help="the loaded adapters' names")
    rm = sub.add_parser("remove", parents=[shared],
                        help="unload an adapter (new requests cannot use it; those running on it finish)")
    rm.add_argument("name")
    return p.parse_args(argv)


def _registry_call(args, call, none: str) -> int:
    """call(url=, protocol=, timeout=) -> names, printed one a line; `none` said on stderr when
    there are none (stdout stays the list, empty)."""
    url = server_url(args)
    if url is None:
        return 2
    try:
        names = call(url=url, protocol=args.protocol, timeout=args.timeout)
    except VoxCPMClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in names:
        print(name)
    if not names:
        print(none, file=sys.stderr)
    return 0


def voices_main(argv) -> int:
    args = parse_voices_args(argv)
    if args.action == "add":
        try:
            audio, rate = load_audio(args.audio)
        except Exception as exc:  # unreadable audio file
            print(f"error: cannot read audio: {exc}", file=sys.stderr)
            return 2
        call = functools.partial(add_voice, args.name, audio, rate, text=args.text, lora=args.lora)
    elif args.action == "remove":
        call = functools.partial(remove_voice, args.name)
    else:
        call = list_voices
    return _registry_call(args, call, "no voices are stored")


def loras_main(argv) -> int:
    args = parse_loras_args(argv)
    action = {"add": add_lora, "remove": remove_lora}.get(args.action)
    call = functools.partial(action, args.name) if action else list_loras
    return _registry_call(args, call, "no LoRA adapters are loaded")


def main(argv=None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C: the request is abandoned, nothing is written
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["voices"]:  # to speak the word itself: voxcpm-tts -- voices
        return voices_main(argv[1:])
    if argv[:1] == ["loras"]:  # (and voxcpm-tts -- loras)
        return loras_main(argv[1:])
    args = parse_args(argv)
    url, model = server_url(args), args.model or MODELS[args.protocol]
    if url is None:
        return 2
    params = {k: getattr(args, k) for k in ("cfg_value", "inference_timesteps", "min_length", "max_length", "seed",
                                            "voice", "voice_mode", "normalize", "lora", "retry_badcase")}
    try:
        if args.reference:
            params["reference_audio"], params["reference_sample_rate"] = load_audio(args.reference)
        if args.prompt_audio:
            params["prompt_audio"], params["prompt_sample_rate"] = load_audio(args.prompt_audio)
            params["prompt_text"] = args.prompt_text
    except Exception as exc:  # unreadable audio file
        print(f"error: cannot read audio: {exc}", file=sys.stderr)
        return 2
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK) or os.path.isdir(args.output):
        print(f"error: cannot write {args.output}: {'no folder ' + folder if not os.path.isdir(folder) else 'not writable'}",
              file=sys.stderr)
        return 2
    try:
        input_arrays(args.text, **params)  # a value out of its input's range (--seed): before any request
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
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
    try:
        result.save(args.output, subtype="FLOAT" if args.float else "PCM_16")
    except (OSError, RuntimeError) as exc:  # soundfile's LibsndfileError is a RuntimeError
        print(f"error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({result.sample_rate} Hz)")
    return 0
