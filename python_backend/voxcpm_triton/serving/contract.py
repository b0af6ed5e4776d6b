"""The public contract of `tts` / `tts_stream`: parse and validate one request's inputs.

Works on plain numpy arrays (what pb_utils tensors hold), so it is tested
without a server. Every problem raises InputError with a message that names
the input. Triton itself already rejects undeclared inputs and wrong dtypes;
the checks here cover values and the rules that tie inputs together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .. import checks
from ..formats import lora as lora_format
from .triton_io import InputError
from .voices import MODES, check_voice_name

MAX_AUDIO_SECONDS = 60.0
INPUT_NAMES = ("TEXT", "REFERENCE_AUDIO", "REFERENCE_SAMPLE_RATE", "PROMPT_AUDIO", "PROMPT_SAMPLE_RATE",
               "PROMPT_TEXT", "CFG_VALUE", "INFERENCE_TIMESTEPS", "MIN_LENGTH", "MAX_LENGTH", "SEED",
               "VOICE", "VOICE_MODE", "RETRY_BADCASE", "NORMALIZE", "LORA")
ACTIONS = ("add", "remove", "list")  # `voices` and `loras` ACTION, the decoder's LORA_ACTION
# Triton's own request parameters, which a frontend may pass on to the model with the request
TRITON_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                               "binary_data_output", "binary_data_size", "triton_enable_empty_final_response"})


@dataclass
class SynthesisRequest:
    text: str
    reference_audio: np.ndarray | None = None
    reference_sample_rate: int | None = None
    prompt_audio: np.ndarray | None = None
    prompt_sample_rate: int | None = None
    prompt_text: str | None = None
    cfg_value: float = checks.DEFAULT_CFG_VALUE
    inference_timesteps: int = checks.DEFAULT_TIMESTEPS
    min_length: int = checks.DEFAULT_MIN_LENGTH
    max_length: int | None = None
    seed: int | None = None
    # `tts` only (tts_stream does not declare it: audio already sent cannot be taken back).
    retry_badcase: bool = True
    voice: str | None = None  # a stored voice (serving/voices.py), used as ...
    voice_mode: str | None = None  # ... reference, continuation or both; None without a voice
    normalize: bool = False  # TEXT normalised (numbers, dates, units... as words) before tokenizing
    lora: str | None = None  # a LoRA adapter loaded in the decoder; None: the base model


def check_parameters(parameters: str | None, inputs: tuple[str, ...]):
    """Refuse request parameters the public models do not take. Over HTTP's generate and
    generate_stream a key that names no input arrives as a parameter: a misspelt input (MAX_LENGHT)
    would otherwise be dropped without a word."""
    try:
        given = json.loads(parameters or "{}")
    except ValueError:
        given = {}
    unknown = sorted(set(given) - TRITON_PARAMETERS) if isinstance(given, dict) else []
    if unknown:
        named = ", ".join(checks.shown(k) for k in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise InputError(f"unknown request parameter{'s' if len(unknown) > 1 else ''} {named}: this model takes "
                         f"no parameters, only the inputs {', '.join(inputs)} (over HTTP generate / "
                         "generate_stream, a key that names no input arrives as a parameter)")


def value(a, name: str, kind):
    """The one value of input `name` (its numpy array; None when absent) as `kind`: str, int, bool or
    float. The orchestrators' inputs and the internal models' (through a Triton request) alike."""
    if a is None:
        return None
    a = np.asarray(a)
    if a.size != 1:
        raise InputError(f"{name} must hold exactly one value, got shape {list(a.shape)}")
    v = a.reshape(-1)[0]
    if kind is str:
        if not isinstance(v, (bytes, np.bytes_, str)):
            raise InputError(f"{name} must be a UTF-8 string (BYTES)")
        if isinstance(v, str):
            return v
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{name} is not valid UTF-8: {e}") from None
    if kind is bool:
        if a.dtype != np.bool_:
            raise InputError(f"{name} must be BOOL, got {a.dtype}")
        return bool(v)
    if kind is int:
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"{name} must be an integer, got {a.dtype}")
        return int(v)
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(a.dtype, np.integer):
        raise InputError(f"{name} must be a number, got {a.dtype}")
    return float(v)


def text(a, name: str, required: bool) -> str | None:
    """Text input `name` (its numpy array; None when absent), checked."""
    s = value(a, name, str)
    if s is None:
        if required:
            raise InputError(f"{name} is required")
        return None
    n = len(s.encode("utf-8"))
    if n > checks.MAX_TEXT_BYTES:
        raise InputError(f"{name} is {n} bytes; the limit is {checks.MAX_TEXT_BYTES}")
    if "\x00" in s:
        raise InputError(f"{name} contains a NUL character")
    return s


def waveform(inputs: dict, name: str, rate_name: str):
    a = inputs.get(name)
    rate = value(inputs.get(rate_name), rate_name, int)
    if a is None:
        if rate is not None:
            raise InputError(f"{rate_name} was given without {name}")
        return None, None
    a = np.asarray(a)
    # The wire is stricter than the offline API, which also takes [1, n] and other float types.
    if a.dtype != np.float32:
        raise InputError(f"{name} must be FP32, got {a.dtype}")
    if a.ndim != 1:
        raise InputError(f"{name} must be a mono waveform of shape [-1], got {list(a.shape)}")
    try:
        return checks.check_waveform(a, rate, name, rate_name, MAX_AUDIO_SECONDS), rate
    except ValueError as e:
        raise InputError(str(e)) from None


def parse(inputs: dict, max_positions: int = 8192) -> SynthesisRequest:
    """inputs: name -> numpy array, for the inputs present in the request. max_positions: the
    model's context length (`max_length` in its config)."""
    unknown = sorted(set(inputs) - set(INPUT_NAMES))
    if unknown:
        raise InputError(f"unknown input(s) {unknown}")
    target = text(inputs.get("TEXT"), "TEXT", required=True)
    if checks.blank(target):
        raise InputError("TEXT is empty (nothing but whitespace or invisible characters)")
    req = SynthesisRequest(text=target)
    req.reference_audio, req.reference_sample_rate = waveform(inputs, "REFERENCE_AUDIO", "REFERENCE_SAMPLE_RATE")
    req.prompt_audio, req.prompt_sample_rate = waveform(inputs, "PROMPT_AUDIO", "PROMPT_SAMPLE_RATE")
    req.prompt_text = text(inputs.get("PROMPT_TEXT"), "PROMPT_TEXT", required=False)
    if (req.prompt_audio is None) != (req.prompt_text is None):
        raise InputError("PROMPT_AUDIO and PROMPT_TEXT must be given together")
    if req.prompt_text is not None and checks.blank(req.prompt_text):
        # as the voices model refuses an empty transcript: a continuation of audio said to hold no words
        raise InputError("PROMPT_TEXT is empty: a prompt needs the transcript of PROMPT_AUDIO; for the voice "
                         "alone, send the audio as REFERENCE_AUDIO")
    _voice(inputs, req)
    cfg = value(inputs.get("CFG_VALUE"), "CFG_VALUE", float)
    steps = value(inputs.get("INFERENCE_TIMESTEPS"), "INFERENCE_TIMESTEPS", int)
    min_len = value(inputs.get("MIN_LENGTH"), "MIN_LENGTH", int)
    max_len = value(inputs.get("MAX_LENGTH"), "MAX_LENGTH", int)
    seed = value(inputs.get("SEED"), "SEED", int)
    req.cfg_value = req.cfg_value if cfg is None else cfg
    req.inference_timesteps = req.inference_timesteps if steps is None else steps
    req.min_length = req.min_length if min_len is None else min_len
    req.max_length = max_len
    req.seed = seed
    retry = value(inputs.get("RETRY_BADCASE"), "RETRY_BADCASE", bool)
    req.retry_badcase = req.retry_badcase if retry is None else retry
    req.normalize = bool(value(inputs.get("NORMALIZE"), "NORMALIZE", bool))
    req.lora = lora_name(inputs)
    if min_len is None and max_len is not None and 1 <= max_len < req.min_length:
        raise InputError(f"MAX_LENGTH ({max_len}) is less than the default MIN_LENGTH ({req.min_length}); "
                         "send MIN_LENGTH too")
    # A prompt takes at least one position; the decoder checks the rest once the prompt is built.
    try:
        checks.check_generation(req.min_length, req.max_length if max_len is not None else max(req.min_length, 1),
                                req.cfg_value, req.inference_timesteps, capacity=max_positions - 1,
                                max_len_default=max_len is None,
                                room=f"the model's context of {max_positions} leaves after the shortest prompt")
    except ValueError as e:
        raise InputError(wire_names(str(e))) from None
    return req


def _voice(inputs: dict, req: SynthesisRequest):
    """VOICE and VOICE_MODE; whether the stored voice can serve the mode is known once it is loaded."""
    voice = value(inputs.get("VOICE"), "VOICE", str)
    mode = value(inputs.get("VOICE_MODE"), "VOICE_MODE", str)
    if voice is None:
        if mode is not None:
            raise InputError("VOICE_MODE was given without VOICE")
        return
    req.voice, req.voice_mode = check_voice_name(voice, "VOICE"), "reference" if mode is None else mode
    if req.voice_mode not in MODES:
        raise InputError(f"VOICE_MODE must be one of {', '.join(MODES)}, got {checks.shown(mode)}")
    # A voice fills a role; inline audio for the same role would be ambiguous.
    if req.reference_audio is not None and req.voice_mode in ("reference", "both"):
        raise InputError(f"VOICE with VOICE_MODE {req.voice_mode} is the reference: leave out REFERENCE_AUDIO")
    if req.prompt_audio is not None and req.voice_mode in ("continuation", "both"):
        raise InputError(f"VOICE with VOICE_MODE {req.voice_mode} is the prompt: leave out PROMPT_AUDIO "
                         "and PROMPT_TEXT")


def lora_name(inputs: dict) -> str | None:
    """LORA: an adapter's name (whether it is loaded, the decoder knows); "" where it is empty (the
    base model, even with a VOICE that has a default adapter); None where it is absent (the VOICE's
    default adapter, if it has one, else the base model). The `voices` model's LORA too."""
    name = value(inputs.get("LORA"), "LORA", str)
    if not name:
        return None if name is None else ""
    try:
        return lora_format.check_lora_name(name)
    except lora_format.LoraError as e:
        raise InputError(f"LORA: {e}") from None


def wire_names(message: str) -> str:
    """The engine's parameter names as the client knows them."""
    for py, wire in (("min_len", "MIN_LENGTH"), ("max_len", "MAX_LENGTH"), ("cfg_value", "CFG_VALUE"),
                     ("inference_timesteps", "INFERENCE_TIMESTEPS"), ("seed", "SEED"), ("lora: ", "LORA: ")):
        message = message.replace(py, wire)
    return message
