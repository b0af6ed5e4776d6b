"""`POST /v1/audio/speech`: the request body, checked, and its Triton inputs.

OpenAI's fields: model, input, voice, instructions, response_format, speed, stream_format.
VoxCPM2's extensions (what the model has and OpenAI's API does not) map one to one onto
`tts_stream` inputs through EXTENSIONS; a field left out is not sent, so the server's default
applies. Values are checked by the server (its message comes back with `param` naming the
field); the checks here are the ones only the gateway can make: OpenAI-level fields, JSON
types, and integers that fit the input's type.
"""

from __future__ import annotations

import unicodedata
from typing import Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from . import errors

DEFAULT_VOICE = "default"  # zero-shot: no stored voice


def blank(text: str) -> bool:
    """Nothing to speak, as the server's checks.blank has it (this package does not import it)."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Mn", "Me") for ch in text)

# request field -> (tts_stream input, numpy dtype). Adding an input is one line here (and a
# field on SpeechRequest).
EXTENSIONS: dict[str, tuple[str, type]] = {
    "seed": ("SEED", np.int64),
    "cfg_value": ("CFG_VALUE", np.float32),
    "inference_timesteps": ("INFERENCE_TIMESTEPS", np.int32),
    "min_length": ("MIN_LENGTH", np.int32),
    "max_length": ("MAX_LENGTH", np.int32),
    "voice_mode": ("VOICE_MODE", np.object_),
    "normalize": ("NORMALIZE", np.bool_),
    "lora": ("LORA", np.object_),
}
# Triton input -> request field, for naming the field an error is about.
PARAMS = {"TEXT": "input", "VOICE": "voice", **{inp: name for name, (inp, _) in EXTENSIONS.items()}}

Int64 = Field(default=None, ge=-2**63, le=2**63 - 1)
Int32 = Field(default=None, ge=-2**31, le=2**31 - 1)


def utf8_text(value):
    """A string that UTF-8 can carry: JSON's escapes can spell a lone surrogate ("\\ud800"), which
    no text is and Triton's BYTES inputs cannot take."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"not valid text: a lone surrogate at character {e.start}") from None
    return value


def finite_float32(value) -> bool:
    try:
        with np.errstate(over="ignore"):  # past float32's range: inf, refused here, not a warning in the log
            return bool(np.isfinite(np.float32(value)))
    except OverflowError:  # an integer past any float
        return False


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form: {"id": "name"}."""
    model_config = ConfigDict(extra="forbid")
    id: StrictStr

    _text = field_validator("id")(utf8_text)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # OpenAI
    model: Optional[StrictStr] = None
    input: StrictStr
    voice: Union[StrictStr, VoiceRef] = DEFAULT_VOICE
    instructions: Optional[StrictStr] = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Union[StrictFloat, StrictInt] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    # VoxCPM2
    seed: Optional[StrictInt] = Int64
    cfg_value: Optional[Union[StrictFloat, StrictInt]] = None
    inference_timesteps: Optional[StrictInt] = Int32
    min_length: Optional[StrictInt] = Int32
    max_length: Optional[StrictInt] = Int32
    voice_mode: Optional[StrictStr] = None
    normalize: Optional[StrictBool] = None
    lora: Optional[StrictStr] = None

    _text = field_validator("*")(utf8_text)

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def text(self) -> str:
        """TEXT: the input, after the instructions as VoxCPM2's "(description)" prefix."""
        if blank(self.input):  # (with instructions, Triton would speak them alone)
            raise errors.bad_request("input is empty", "input")
        instructions = (self.instructions or "").strip()
        if not instructions:
            return self.input
        if "\x00" in instructions:  # Triton's answer would name TEXT, which is the input's field
            raise errors.bad_request("instructions contains a NUL character", "instructions")
        if "(" in instructions or ")" in instructions:
            raise errors.bad_request("instructions must not contain parentheses: they are sent as VoxCPM2's "
                                     "\"(description)\" prefix of the text", "instructions")
        return f"({instructions}){self.input}"

    def check(self, served_models: tuple[str, ...]):
        if self.model is not None and self.model not in served_models:
            raise errors.APIError(404, f"The model {errors.quoted(self.model)} does not exist; this server serves "
                                  f"{', '.join(served_models)} (GET /v1/models)", "model", "model_not_found")
        if self.voice_mode is not None and self.voice_name == DEFAULT_VOICE:
            raise errors.bad_request(f"voice_mode needs a stored voice; {DEFAULT_VOICE!r} is the model's own voice "
                                     "(zero-shot)", "voice_mode")
        if self.speed != 1.0:
            raise errors.bad_request(f"speed must be 1.0, got {self.speed}: VoxCPM2 has no speed control, and "
                                     "resampling the audio would change its pitch", "speed")

    def triton_inputs(self) -> dict[str, np.ndarray]:
        arrays = {"TEXT": np.array([self.text().encode("utf-8")], dtype=np.object_)}
        if self.voice_name != DEFAULT_VOICE:
            arrays["VOICE"] = np.array([self.voice_name.encode("utf-8")], dtype=np.object_)
        for name, (inp, dtype) in EXTENSIONS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if dtype is np.object_:
                value = value.encode("utf-8")
            elif dtype is np.float32 and not finite_float32(value):
                raise errors.bad_request(f"{name} must be a finite number", name)
            arrays[inp] = np.array([value], dtype=dtype)
        return arrays
