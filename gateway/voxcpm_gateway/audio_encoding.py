"""Audio in the OpenAI speech API's formats, encoded chunk by chunk as the audio arrives.

  pcm   16-bit little-endian mono samples, nothing else (at the model's rate: 48 kHz for VoxCPM2)
  wav   a RIFF/WAVE header, then the same samples; streamed, so the header's RIFF and data sizes
        are 0xFFFFFFFF ("unknown length", as ffmpeg writes to a pipe); readers take the length
        from the data
  flac  lossless (soundfile), encoded as the audio comes but sent whole at the end: its header
        holds the total length and MD5, and readers such as libsndfile refuse a stream that leaves
        them unset
  mp3, opus (in Ogg), aac (ADTS): PyAV (FFmpeg's libmp3lame, libopus, aac), streamed

pcm, wav and flac carry the same 16-bit samples: the float audio clipped to [-1, 1] and
rounded to the nearest multiple of 1/32767 (`quantize16`). The lossy formats encode the float
audio itself. Every format is at the model's rate (48 kHz for VoxCPM2) except opus for a model
of another rate: Opus is a 48 kHz codec, so its input is resampled to 48 kHz.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np


def quantize16(audio: np.ndarray) -> np.ndarray:
    """float audio -> int16: clip to [-1, 1], then round(x * 32767) (half to even)."""
    return np.rint(np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")


class Encoder:
    """encode(chunk) -> the bytes ready so far; finish() -> the rest."""

    out_rate: int | None = None  # the rate of the encoded audio; None: the rate it was given

    def encode(self, audio: np.ndarray) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        return b""

    def close(self):
        """Free resources when the stream ends early."""


class PcmEncoder(Encoder):
    def encode(self, audio):
        return quantize16(audio).tobytes()


STREAMING_SIZE = 0xFFFFFFFF


def wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """The canonical 44-byte PCM WAVE header of a stream whose length is not known yet."""
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", STREAMING_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", STREAMING_SIZE))


class WavEncoder(PcmEncoder):
    def __init__(self, sample_rate: int):
        self.header = wav_header(sample_rate)

    def encode(self, audio):
        header, self.header = self.header, b""
        return header + super().encode(audio)

    def finish(self):
        return self.header  # no audio at all: the header alone is still a (empty) wav file


class FlacEncoder(Encoder):
    """Encoded chunk by chunk into memory (compressed, not the whole utterance's samples), sent whole
    at the end, once libsndfile has written the total length and MD5 into the header."""

    def __init__(self, sample_rate: int):
        import soundfile as sf

        self.buf = io.BytesIO()
        self.file = sf.SoundFile(self.buf, "w", samplerate=sample_rate, channels=1, format="FLAC", subtype="PCM_16")

    def encode(self, audio):
        self.file.write(quantize16(audio))
        return b""

    def finish(self):
        self.file.close()
        out, self.buf = self.buf.getvalue(), io.BytesIO()
        return out

    def close(self):
        if not self.file.closed:
            self.file.close()


class _Sink:
    """A write-only, non-seekable file for FFmpeg's muxers: what they write is collected and
    taken after each chunk (they then write headers up front and never seek back)."""

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class AvEncoder(Encoder):
    """A PyAV (FFmpeg) encoder and muxer writing to a stream. Deterministic (bitexact): the same
    audio gives the same bytes."""

    def __init__(self, container_format: str, codec: str, sample_rate: int, bit_rate: int,
                 rates: tuple[int, ...] | None = None, options: dict | None = None):
        import av

        self._av = av
        self.in_rate = sample_rate
        out_rate = sample_rate if not rates or sample_rate in rates else min(
            [r for r in rates if r >= sample_rate] or [max(rates)])
        self.out_rate = out_rate
        self.sink = _Sink()
        self.container = av.open(self.sink, mode="w", format=container_format,
                                 options={"fflags": "+bitexact", **(options or {})})
        self.stream = self.container.add_stream(codec, rate=out_rate, layout="mono", options={"flags": "+bitexact"})
        self.stream.bit_rate = bit_rate

    def _mux(self, frame):
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def encode(self, audio):
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, np.float32)[None, :], format="flt",
                                                 layout="mono")
        frame.sample_rate = self.in_rate
        self._mux(frame)
        return self.sink.take()

    def finish(self):
        self._mux(None)
        self.container.close()
        return self.sink.take()

    def close(self):
        try:
            self.container.close()
        except Exception:  # noqa: BLE001 - an unfinished stream: nothing left to give anyone
            pass


@dataclass(frozen=True)
class Format:
    media_type: str
    make: Callable[[int], Encoder]  # sample rate -> encoder
    cpu_heavy: bool  # encode off the event loop
    needs: str | None = None  # the module its encoder imports


FORMATS: dict[str, Format] = {
    "pcm": Format("audio/pcm", lambda rate: PcmEncoder(), False),
    "wav": Format("audio/wav", WavEncoder, False),
    "flac": Format("audio/flac", FlacEncoder, True, "soundfile"),
    "mp3": Format("audio/mpeg", lambda rate: AvEncoder("mp3", "libmp3lame", rate, 128_000), True, "av"),
    # Opus runs at 48 kHz (decoders give 48 kHz whatever the input was): other rates are resampled.
    # Ogg pages of at most 20 ms (one Opus frame), so each chunk's audio leaves with it.
    "opus": Format("audio/ogg", lambda rate: AvEncoder("ogg", "libopus", rate, 96_000, (48000,),
                                                       {"page_duration": "20000"}), True, "av"),
    "aac": Format("audio/aac", lambda rate: AvEncoder("adts", "aac", rate, 128_000), True, "av"),
}


def unavailable_formats() -> dict[str, str]:
    """Import the encoders' libraries now (not on a first request); format -> why it cannot be made."""
    import importlib

    missing = {}
    for name in sorted({f.needs for f in FORMATS.values() if f.needs}):
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing[name] = str(e)
    return {fmt: f"{f.needs} is not installed ({missing[f.needs]})" for fmt, f in FORMATS.items()
            if f.needs in missing}
