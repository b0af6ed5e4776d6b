"""Every model parameter in one table: its model, name, type, what it allows, its default (the
value config.pbtxt holds) and one line of doc. Models read their parameters only through `read`:
a key the table does not name, or a value it does not allow, stops the model with a message
naming the parameter.

Of these, the environment overrides only VOXCPM_CHECKPOINT, VOXCPM_DEVICE, VOXCPM_DTYPE,
VOXCPM_VOICES_DIR and VOXCPM_LORA_DIR (one deployment points every model at its checkpoint without
editing every model's config.pbtxt). The kernels' switches (VOXCPM_FUSED_*, VOXCPM_SPLIT_K) and
VOXCPM_GC_FREEZE are environment variables only, read where they act; README's configuration table
lists them all.

Rules that tie models together (`INVARIANTS`) are checked at start-up against the sibling
models' config.pbtxt, which lie next to the model's own directory.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("voxcpm_triton.parameters")

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# model.config.DTYPES' names: this file is also read alone, outside its package (scripts/repository_copy.py)
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
# Triton's own setting, not a parameter; the invariants read it too.
IDLE_US = "sequence_batching.max_sequence_idle_microseconds"


@dataclass(frozen=True)
class Param:
    model: str
    name: str
    kind: str  # int, float, ms, bool, ints, choice, path, str
    default: str  # as config.pbtxt writes it; "": unset (the model decides)
    doc: str
    choices: tuple = ()
    env: str | None = None  # the documented environment variable that wins over config.pbtxt

    def allowed(self) -> str:
        return {"int": "a positive integer", "float": "a positive number", "ms": "milliseconds, 0 or more",
                "bool": "true or false",
                "ints": "positive integers separated by commas", "path": "a directory", "str": "a string",
                "choice": "one of " + ", ".join(self.choices)}[self.kind]

    def parse(self, text: str):
        """The typed value of `text`; empty means the default, None where that is empty too."""
        text = (text or "").strip() or self.default
        if not text:
            return None
        value = _PARSERS[self.kind](self, text)
        if value is None:
            raise ValueError(f"parameter {self.name!r} of model {self.model!r} must be {self.allowed()}, "
                             f"got {text!r}")
        return value


def _int(_, text):
    return int(text) if text.isascii() and text.isdigit() and int(text) >= 1 else None


def _float(_, text):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < math.inf else None


def _ms(_, text):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < math.inf else None


def _bool(_, text):
    text = text.lower()
    return True if text in TRUE else False if text in FALSE else None


def _ints(_, text):
    values = tuple(_int(None, x.strip()) for x in text.split(","))
    return None if None in values else values


_PARSERS: dict[str, Callable] = {
    "int": _int, "float": _float, "ms": _ms, "bool": _bool, "ints": _ints, "path": lambda _, t: t, "str": lambda _, t: t,
    "choice": lambda p, t: t.lower() if t.lower() in p.choices else None,  # as bools: BF16 is bf16
}

_CHECKPOINT_DOC = "checkpoint directory; empty: the embedded tiny checkpoint"
_DEVICE_DOC = "torch device; empty: cuda if a GPU is present, else cpu"
_VOICES_DOC = "directory of stored voices; empty: ~/.local/share/voxcpm/voices ($XDG_DATA_HOME)"

PARAMETERS: tuple[Param, ...] = (
    *(Param(m, "checkpoint", "path", "", _CHECKPOINT_DOC, env="VOXCPM_CHECKPOINT")
      for m in ("tts", "tts_stream", "tokenizer", "decoder", "vae_encoder", "vae_decoder", "voices")),
    # One directory for all three: `voices` writes it, the orchestrators read it.
    *(Param(m, "voices_dir", "path", "", _VOICES_DOC, env="VOXCPM_VOICES_DIR") for m in ("tts", "tts_stream", "voices")),
    *(Param(m, "device", "str", "", _DEVICE_DOC, env="VOXCPM_DEVICE") for m in ("decoder", "vae_encoder", "vae_decoder")),
    Param("decoder", "dtype", "choice", "", "weights and activations; empty: bfloat16 on a GPU, float32 on the CPU",
          DTYPES, env="VOXCPM_DTYPE"),
    Param("decoder", "max_num_seqs", "int", "128", "requests decoding together"),
    Param("decoder", "max_waiting_requests", "int", "256", "requests queued for admission; one more is busy"),
    Param("decoder", "kv_cache_mb", "float", "", "KV cache size in MiB; empty: 25% of free GPU memory"),
    Param("decoder", "num_blocks", "int", "", "KV cache size in blocks, instead of kv_cache_mb; empty: from kv_cache_mb"),
    Param("decoder", "block_size", "int", "16", "tokens per KV cache block"),
    Param("decoder", "chunk_schedule", "ints", "1,4,16", "patches per streamed chunk (the last repeats)"),
    Param("decoder", "playback_margin_ms", "ms", "100",
          "a tts_stream client with less audio than this left (playing from its first chunk) gets its "
          "pending patches at once, as the largest chunk_schedule size they fill (all once it ran dry), "
          "not when its chunk fills; 0: chunks by chunk_schedule only"),
    Param("decoder", "cuda_graphs", "bool", "true", "GPU: a CUDA graph per batch bucket"),
    Param("decoder", "compile", "bool", "true", "GPU: LocDiT/LocEnc and the LM layer math compiled"),
    Param("decoder", "attention", "choice", "auto", "decode attention kernels", ("auto", "triton", "torch")),
    Param("decoder", "precision", "choice", "bf16",
          "linear weights: bf16 (as loaded) or fp8 (e4m3; a GPU of compute capability >= 8.9, dtype bfloat16)",
          ("bf16", "fp8")),
    Param("decoder", "batch_buckets", "ints", "1,2,4,8,16,24,32,48,64,96,128,192,256",
          "batch sizes with a decode graph each, those below max_num_seqs (which always has one); a step "
          "runs padded to the smallest that holds its requests"),
    Param("decoder", "timestep_buckets", "ints", "4,8,10,12,16,24,32,50,100",
          "CFM loop lengths with a decode graph each; the last must be 100"),
    Param("decoder", "enable_prefix_caching", "bool", "true",
          "requests whose prompts start alike (a voice, a reference) share that prefix's KV blocks"),
    Param("decoder", "lora_dir", "path", "", "directory of LoRA adapters, one subfolder each; empty: none (LoRA off)",
          env="VOXCPM_LORA_DIR"),
    Param("decoder", "max_loras", "int", "8", "LoRA adapters held at once in the GPU slot tables (with lora_dir)"),
    Param("decoder", "max_lora_rank", "int", "32", "largest LoRA rank an adapter may have (with lora_dir)"),
    Param("decoder", "lora_targets", "choice", "default",
          "layers the slot tables cover besides the targets of the adapters found at start-up, for adapters "
          "added later: default (LM and LocDiT attention, the official defaults) or all (every layer an "
          "adapter may target: more GPU memory, lora_merge's copy of the covered weights included, and steps "
          "mixing adapters run LoRA ops on every one)",
          ("default", "all")),
    Param("decoder", "lora_merge", "bool", "true",
          "a step whose requests all use one adapter (or none) runs it merged into the weights, at the "
          "plain network's speed (with lora_dir; costs a copy of the adapted weights and a second set "
          "of decode graphs; a LoRA request's rounding then depends on its neighbours; off with fp8)"),
    Param("decoder", "decode_audio", "bool", "true",
          "the decoder decodes its chunks to audio itself (the VAE in its process, on a CUDA stream of the "
          "highest priority) and tts/tts_stream skip vae_decoder; false: vae_decoder decodes them"),
    Param("decoder", "first_audio_priority", "bool", "true",
          "with decode_audio: a step whose running rows all fill their first chunks (a lone request, a "
          "burst's first wave) has that audio decoded before the next step starts, so a newcomer's first "
          "audio does not wait behind a step; no request already playing is held back"),
    Param("decoder", "audio_rush", "bool", "true",
          "with decode_audio: while the audio thread sends a round's audio, a chunk queued for a client that "
          "has none yet, or that would run out before the round is sent, is decoded and sent between two "
          "of those sends, not after the round (shorter first-audio tails, smoother playback under load, "
          "at some throughput); false: every chunk waits for the next round"),
    Param("decoder", "audio_channel", "bool", "true",
          "with decode_audio: an orchestrator's calls get their audio chunks and their ends over a Unix "
          "socket of its process (in the server's run directory), written by a thread of their own, "
          "not as responses (a round trip through the server each, made one after another by the audio "
          "thread); the call carries an empty first response and its final one; false: every chunk a response"),
    Param("decoder", "prefill_pack_graphs", "bool", "true",
          "GPU with cuda_graphs: prompts admitted together (a burst) prefill as one CUDA graph per total-length "
          "bucket (up to 2048 new positions a pack; more are split), not as one eager packed call; false: eager"),
    Param("voices", "max_voices", "int", "1000", "stored voices at most; adding a new name past it is refused"),
    Param("tts_stream", "max_concurrent_streams", "int", "256", "streams in flight per instance; one more is busy"),
    Param("tts_stream", "max_normalize_waiting", "int", "16",
          "NORMALIZE requests per instance waiting for one of its 2 text_normalizer calls in flight; one more is busy"),
    Param("vae_decoder", "stream_idle_timeout_s", "float", "120", "state of a stream idle this long is dropped"),
    Param("vae_decoder", "compile", "bool", "true", "GPU: the snake activations fused by torch.compile"),
    Param("vae_decoder", "triton_kernels", "bool", "true", "GPU: residual units, upsampling and the last conv in Triton kernels"),
    Param("vae_decoder", "max_streams", "int", "256", "streams with state held at once"),
    Param("vae_decoder", "max_chunk_patches", "int", "256", "patches per LATENTS or CONTEXT chunk at most"),
    Param("vae_decoder", "cuda_graphs", "bool", "true", "GPU: a CUDA graph per batch bucket"),
    Param("vae_decoder", "graph_patches", "ints", "1,4,16", "chunk lengths (patches) with CUDA graphs"),
)
# Old names a config.pbtxt may still hold: refused with the new one named, not as unknown.
RENAMED = {("decoder", "max_batch_size"): "max_num_seqs (Triton's own max_batch_size, outside parameters, stays 0)"}
TABLE: dict[str, dict[str, Param]] = {}
for _p in PARAMETERS:
    TABLE.setdefault(_p.model, {})[_p.name] = _p


def parse_values(model: str, raw: dict[str, str], env: bool = True) -> dict:
    """name -> typed value for every parameter of `model`, from config.pbtxt's strings `raw`."""
    params = TABLE.get(model, {})  # a model with no parameters takes none
    unknown = sorted(set(raw) - set(params))
    for name in unknown:
        if (model, name) in RENAMED:
            raise ValueError(f"parameter {name!r} of model {model!r} is now called {RENAMED[model, name]}")
    if unknown:
        raise ValueError(f"model {model!r} has no parameter(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(sorted(params))}")
    # An environment variable that is empty or blank is unset: config.pbtxt's value holds.
    return {name: p.parse((env and p.env and os.environ.get(p.env, "").strip()) or raw.get(name, ""))
            for name, p in params.items()}


# ---------------------------------------------------------------- config.pbtxt, without protobuf
# Protobuf's text format, as far as a model config uses it: fields `name: value` or `name { ... }` (or
# `< ... >`), separated by nothing, `,` or `;`; lists `[a, b]`; strings in either quote, with escapes,
# adjacent ones joined; `#` comments.
_TOKEN = re.compile(r"""\s+|#[^\n]*|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[{}<>\[\]:,;]|[^\s{}<>\[\]:,;"'#]+""")
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _unescape(m: re.Match) -> str:
    e = m.group(1)
    if e[0] == "x":
        return chr(int(e[1:], 16))
    if e[0] in "01234567":
        return chr(int(e, 8))
    return _ESCAPES.get(e, e)


def _pbtxt_value(tokens: list[str], i: int) -> tuple[object, int, bool]:
    """The value at tokens[i] -> (it, the index after it, whether it is a list)."""
    tok = tokens[i]
    if tok in ("{", "<"):
        fields, i = _pbtxt_message(tokens, i + 1, "}" if tok == "{" else ">")
        return fields, i, False
    if tok == "[":
        items, i = [], i + 1
        while tokens[i] != "]":
            if tokens[i] != ",":
                item, i, _ = _pbtxt_value(tokens, i)
                items.append(item)
            else:
                i += 1
        return items, i + 1, True
    if tok[0] in "\"'":
        text = ""
        while i < len(tokens) and tokens[i][0] in "\"'":  # "a" "b" is "ab"
            text += _ESCAPE.sub(_unescape, tokens[i][1:-1])
            i += 1
        return text, i, False
    return tok, i + 1, False


def _pbtxt_message(tokens: list[str], i: int, close: str | None) -> tuple[dict, int]:
    """The fields from tokens[i] to `close` -> ({name: [values]}, the index after `close`)."""
    fields: dict[str, list] = {}
    while i < len(tokens) and tokens[i] != close:
        if tokens[i] in (",", ";"):
            i += 1
            continue
        name, i = tokens[i], i + 1
        if tokens[i] == ":":
            i += 1
        value, i, many = _pbtxt_value(tokens, i)
        fields.setdefault(name, []).extend(value if many else [value])
    if close is not None and i == len(tokens):
        raise IndexError
    return fields, i + 1


def parse_pbtxt(text: str) -> dict:
    """A model config in protobuf's text format -> {field: [values]}, a message's value a dict alike."""
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"not protobuf text format at line {text.count(chr(10), 0, pos) + 1}: {text[pos:pos + 20]!r}")
        if not (m.group()[0].isspace() or m.group()[0] == "#"):
            tokens.append(m.group())
        pos = m.end()
    try:
        return _pbtxt_message(tokens, 0, None)[0]
    except IndexError:
        raise ValueError("not protobuf text format: it ends inside a field") from None


def read_pbtxt(path: str) -> tuple[dict[str, str], int | None]:
    """A config.pbtxt's `parameters` (key -> string_value) and its max_sequence_idle_microseconds."""
    with open(path, encoding="utf-8") as f:
        cfg = parse_pbtxt(f.read())
    params = {}
    for entry in cfg.get("parameters", []):
        if isinstance(entry, dict) and entry.get("key"):
            value = (entry.get("value") or [{}])[-1]
            params[str(entry["key"][-1])] = str((value.get("string_value") or [""])[-1]) if isinstance(value, dict) else ""
    idle = [b["max_sequence_idle_microseconds"][-1] for b in cfg.get("sequence_batching", [])
            if isinstance(b, dict) and "max_sequence_idle_microseconds" in b]
    return params, int(idle[-1]) if idle else None


def with_parameters(text: str, values: dict[str, str]) -> str:
    """A config.pbtxt's `text` with each parameter of `values` (key -> string_value) set: its entry's
    value replaced where the key is given outside comments, else a `parameters` entry appended. Only
    what `read_pbtxt` reads back as written is taken (ValueError otherwise); whether a model accepts it
    is `read`'s to say (tests give bad values on purpose)."""
    lines = text.splitlines()
    for key, value in values.items():
        if not re.fullmatch(r"[A-Za-z0-9_]+", key):
            raise ValueError(f"parameter name {key!r}: letters, digits and _ only")
        if re.search(r'[#"\\\n]', value):
            raise ValueError(f"parameter {key!r}: value {value!r} cannot hold #, quotes, backslashes or newlines")
        named = re.compile(r'key\s*:\s*"' + key + '"')
        entry = re.compile(r'(key\s*:\s*"' + key + r'"\s*value\s*:?\s*\{\s*string_value\s*:\s*)"[^"]*"')
        found = False
        for i, line in enumerate(lines):
            code, hash_, comment = line.partition("#")
            if not named.search(code):
                continue
            code, n = entry.subn(lambda m: m.group(1) + f'"{value}"', code)
            if not n:  # an entry over several lines: appending would give the key twice
                raise ValueError(f"parameter {key!r}: its entry on line {i + 1} is not on one line as "
                                 "`key: \"...\" value { string_value: \"...\" }`; edit it by hand")
            lines[i], found = code + hash_ + comment, True
        if not found:
            lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def _args_config(args: dict) -> tuple[dict[str, str], int | None]:
    cfg = json.loads(args["model_config"])
    raw = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
    idle = cfg.get("sequence_batching", {}).get("max_sequence_idle_microseconds")
    return raw, None if idle is None else int(idle)


# ---------------------------------------------------------------- rules across parameters and models
@dataclass(frozen=True)
class Invariant:
    uses: tuple[str, ...]  # "model.parameter" it reads
    rule: Callable[[dict], str | None]  # model -> values; the problem, or None
    fatal: bool  # False: a logged warning
    why: str


def _chunk_fits(c):
    if c["decoder"]["decode_audio"]:  # vae_decoder is never called
        return None
    longest, limit = max(c["decoder"]["chunk_schedule"]), c["vae_decoder"]["max_chunk_patches"]
    if longest > limit:
        return (f"decoder's parameter 'chunk_schedule' sends chunks of {longest} patches, more than vae_decoder's "
                f"parameter 'max_chunk_patches' ({limit}) takes")
    return None


def _chunk_has_graph(c):
    if c["decoder"]["decode_audio"]:  # the decoder decodes its chunks itself, with a graph for each length
        return None
    missing = sorted(set(c["decoder"]["chunk_schedule"]) - set(c["vae_decoder"]["graph_patches"]))
    if missing and c["vae_decoder"]["cuda_graphs"]:
        return (f"decoder's parameter 'chunk_schedule' has chunk lengths {missing} that vae_decoder's parameter "
                "'graph_patches' has no CUDA graph for: they decode as graph-sized pieces")
    return None


def _idle_fits(c):
    timeout, idle_us = c["vae_decoder"]["stream_idle_timeout_s"], c["vae_decoder"][IDLE_US]
    if idle_us is not None and timeout > idle_us / 1e6:
        return (f"parameter 'stream_idle_timeout_s' of model 'vae_decoder' ({timeout:g}) must not exceed the "
                f"sequence batcher's max_sequence_idle_microseconds ({idle_us / 1e6:g} s)")
    return None


def _voices_dir_shared(c):
    if os.environ.get("VOXCPM_VOICES_DIR", "").strip():  # overrides all three alike (siblings are read without it)
        return None
    dirs = {m: c[m]["voices_dir"] for m in ("tts", "tts_stream", "voices") if m in c}
    if len(set(dirs.values())) > 1:
        return (f"parameter 'voices_dir' of models {', '.join(dirs)} ({', '.join(repr(d or '') for d in dirs.values())}) "
                "must name one directory")
    return None


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(("decoder.chunk_schedule", "decoder.decode_audio", "vae_decoder.max_chunk_patches"), _chunk_fits, True,
              "vae_decoder refuses a longer chunk: every stream would fail"),
    Invariant(("decoder.chunk_schedule", "decoder.decode_audio", "vae_decoder.cuda_graphs",
               "vae_decoder.graph_patches"), _chunk_has_graph, False, "a chunk length without a graph only decodes slower"),
    Invariant(("vae_decoder.stream_idle_timeout_s", f"vae_decoder.{IDLE_US}"), _idle_fits, True,
              "Triton frees an idle sequence without telling the model: the model must drop its state no later"),
    Invariant(("tts.voices_dir", "tts_stream.voices_dir", "voices.voices_dir"), _voices_dir_shared, True,
              "voices added through `voices` must be where tts and tts_stream look for them"),
)


def check_invariants(configs: dict[str, dict], model: str):
    """Apply the invariants that read `model` and only models in `configs` (model -> values)."""
    for inv in INVARIANTS:
        models = {u.split(".")[0] for u in inv.uses}
        if model not in models or not models <= set(configs):
            continue
        problem = inv.rule(configs)
        if problem and inv.fatal:
            raise ValueError(problem)
        if problem:
            log.warning("%s (%s)", problem, inv.why)


def sibling_values(model_dir: str, name: str) -> dict | None:
    """The values of sibling model `name` from its config.pbtxt, or None where it has none."""
    path = os.path.join(model_dir, os.pardir, name, "config.pbtxt")
    if name not in TABLE or not os.path.isfile(path):
        return None
    raw, idle = read_pbtxt(path)
    return {**parse_values(name, raw, env=False), IDLE_US: idle}


def read(args: dict, model: str) -> dict:
    """The parameters of `model` (its role: decoder, vae_decoder, ...) from Triton's `args`, typed
    and checked, with the documented environment overrides; the invariants with its siblings are
    checked on the way."""
    raw, idle = _args_config(args)
    values = parse_values(model, raw)
    configs = {model: {**values, IDLE_US: idle}}
    if args.get("model_repository"):
        for name in TABLE:
            if name != model and (sib := sibling_values(args["model_repository"], name)) is not None:
                configs[name] = sib
    check_invariants(configs, model)
    return values


# ---------------------------------------------------------------- the checkpoint
def resolve_checkpoint(path: str | None) -> str:
    """The `checkpoint` parameter's directory, else the embedded tiny checkpoint."""
    if path:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"VoxCPM2 checkpoint directory not found: {path}")
        return path
    from ..paths import DEFAULT_TINY_DIR

    if os.path.isfile(os.path.join(DEFAULT_TINY_DIR, "config.json")):
        return DEFAULT_TINY_DIR
    from ..testing import ensure_tiny_checkpoint  # imports torch: only when generating

    return ensure_tiny_checkpoint()
