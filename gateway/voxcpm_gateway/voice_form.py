"""POST /v1/audio/voices's multipart form: read strictly, and its fields checked by name."""

from __future__ import annotations

from contextlib import aclosing
from email.message import Message

from starlette.datastructures import FormData, Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from . import errors
from .speech_request import DEFAULT_VOICE

FIELDS = {"name", "audio_sample", "ref_text", "lora", "consent", "type"}


class _BadText(MultiPartException):
    def __init__(self, field: str, charset: str):
        super().__init__(f"{errors.quoted(field)} is not valid {charset} text: send UTF-8, or name the charset in "
                         "the part's Content-Type (text/plain; charset=...)")
        self.field = field


def _part_charset(part, default: str) -> str:
    """The charset a text part names in its own Content-Type, else the form's."""
    content_type = Headers(raw=part.item_headers).get("content-type")
    if not content_type:
        return default
    message = Message()
    message["content-type"] = content_type
    return message.get_content_charset() or default


class _CutOff(MultiPartException):
    """The body ended before the form's closing boundary (or had none at all)."""


class _StrictParser(MultiPartParser):
    """Starlette's parser, except that a text field is decoded with the charset its part names (else
    the form's, UTF-8 unless the request's Content-Type says otherwise), and refused if it does not
    decode: Starlette falls back to latin-1 instead, so a transcript in another encoding (GBK, say)
    would be stored garbled. audio_sample is left to Starlette: sent as a text field, it is refused
    by `fields` with a message that says how to send it. A form cut off before its closing boundary
    is refused as such: Starlette drops its unfinished part, which was then said to be missing."""

    ended = False

    def on_end(self) -> None:
        self.ended = True

    async def parse(self) -> FormData:
        form = await super().parse()
        if not self.ended:
            await form.close()
            raise _CutOff("the multipart body ended before its closing boundary (--BOUNDARY--): it was cut off, "
                          "or its Content-Length is short")
        return form

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is not None or part.field_name == "audio_sample":
            return super().on_part_end()
        charset = _part_charset(part, getattr(self, "_charset", "utf-8"))
        try:
            text = bytes(part.data).decode(charset)
        except (UnicodeDecodeError, LookupError):
            raise _BadText(part.field_name, charset) from None
        self.items.append((part.field_name, text))


async def read(request: Request) -> FormData:
    """The form, its files spooled to temporary files. Any field may arrive as a file part: counted
    as fields here, refused by name in `fields`."""
    received = 0

    async def counted(stream):
        nonlocal received
        async for chunk in stream:
            received += len(chunk)
            yield chunk

    try:
        async with aclosing(request.stream()) as stream:
            return await _StrictParser(request.headers, counted(stream), max_files=len(FIELDS),
                                       max_fields=len(FIELDS)).parse()
    except _BadText as e:
        raise errors.bad_request(e.message, e.field if e.field in FIELDS else None) from None
    except _CutOff as e:
        message = e.message if received else ("the request body is empty: a voice upload is a multipart/form-data "
                                              "body with the fields name and audio_sample")
        raise errors.bad_request(message, None, "invalid_request") from None
    except MultiPartException as e:
        raise errors.bad_request(e.message, None, "invalid_request") from None


def fields(form) -> tuple:
    """(name, audio_sample, ref_text, lora) of POST /v1/audio/voices's form, each checked."""
    unknown = sorted(set(form.keys()) - FIELDS)
    if unknown:
        raise errors.bad_request(f"unknown field(s) {', '.join(unknown)}; the fields are name, audio_sample, "
                                 "ref_text (optional), lora (optional: the voice's default LoRA adapter) "
                                 "and consent (optional, not checked)", unknown[0])
    for key in sorted(set(form.keys())):
        if len(form.getlist(key)) > 1:
            raise errors.bad_request(f"{key} was given more than once", key)
        if key != "audio_sample" and not isinstance(form[key], str):
            raise errors.bad_request(f"{key} must be a text field, not a file", key)
    name, upload, ref_text = form.get("name"), form.get("audio_sample"), form.get("ref_text")
    lora = form.get("lora")
    kind = form.get("type")
    if kind not in (None, "audio_sample"):
        raise errors.bad_request(f"type {errors.quoted(kind)} is not supported: voices are made from an audio_sample",
                                 "type")
    if not name:
        raise errors.bad_request("name is required", "name")
    if name == DEFAULT_VOICE:
        raise errors.bad_request(f"the name {DEFAULT_VOICE!r} is reserved for zero-shot synthesis", "name")
    if isinstance(upload, str):  # a part without a filename is a text field to multipart parsers
        raise errors.bad_request("audio_sample came as a text field: send it as a file part (Content-Disposition "
                                 "with a filename, as curl -F 'audio_sample=@voice.wav' does)", "audio_sample")
    if not isinstance(upload, UploadFile):
        raise errors.bad_request("audio_sample is required: an audio file (wav, flac, mp3, ogg, m4a, ...)",
                                 "audio_sample")
    return name, upload, ref_text, lora
