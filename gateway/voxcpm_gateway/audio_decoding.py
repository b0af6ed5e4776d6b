"""Uploaded voice samples (any common format) -> a mono float32 waveform and its rate.

libsndfile (soundfile) reads WAV, FLAC, Ogg Vorbis/Opus and MP3 exactly as the project's
client does (channels averaged); anything else FFmpeg knows (m4a/AAC, webm, mp4, ...) goes
through PyAV. Both decode block by block, averaging the channels of each block, and stop
past `max_seconds`; a file of more than MAX_CHANNELS channels or a rate outside the voices
model's range is refused before decoding. So a small compressed file cannot expand into
unbounded memory or minutes of one thread's time.
"""

from __future__ import annotations

import io

import numpy as np

from . import errors

MAX_CHANNELS = 8  # 7.1 surround; a voice sample is mono or stereo
MIN_RATE, MAX_RATE = 1_000, 384_000  # what the voices model takes (SAMPLE_RATE)
BLOCK_FRAMES = 1 << 16


def decode(data: bytes, max_seconds: float, param: str = "audio_sample") -> tuple[np.ndarray, int]:
    if not data:
        raise errors.bad_request(f"{param} is empty", param)
    try:
        return _soundfile(data, max_seconds, param)
    except (errors.APIError, MemoryError):
        raise
    except Exception:  # noqa: BLE001 - not a format libsndfile reads: try FFmpeg
        pass
    try:
        return _pyav(data, max_seconds, param)
    except (errors.APIError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - neither could read it
        raise errors.bad_request(f"{param} could not be decoded as audio: {e}", param) from None


def _check_layout(channels: int, rate: int, param: str):
    if channels > MAX_CHANNELS:
        raise errors.bad_request(f"{param} has {channels} channels; at most {MAX_CHANNELS} are taken "
                                 "(they are averaged to mono)", param)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise errors.bad_request(f"{param}'s sample rate {rate} Hz is outside [{MIN_RATE}, {MAX_RATE}] Hz", param)


def _too_long(param: str, max_seconds: float) -> errors.APIError:
    return errors.bad_request(f"{param} is longer than {max_seconds:g} s", param)


def _soundfile(data: bytes, max_seconds: float, param: str):
    import soundfile as sf

    with sf.SoundFile(io.BytesIO(data)) as f:
        rate = int(f.samplerate)
        _check_layout(f.channels, rate, param)
        limit = int(max_seconds * rate) + 1
        parts, total = [], 0
        while total < limit:
            block = f.read(frames=min(BLOCK_FRAMES, limit - total), dtype="float32", always_2d=True)
            if not len(block):
                break
            parts.append(block.mean(axis=1, dtype=np.float32))
            total += len(block)
    if total >= limit:
        raise _too_long(param, max_seconds)
    if not total:
        raise errors.bad_request(f"{param} holds no audio", param)
    return np.ascontiguousarray(np.concatenate(parts)), rate


def _pyav(data: bytes, max_seconds: float, param: str):
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise errors.bad_request(f"{param} has no audio stream", param)
        stream = container.streams.audio[0]
        rate = int(stream.codec_context.sample_rate or stream.rate or 0)
        _check_layout(stream.codec_context.channels, rate, param)
        # float, rate and channels as they are, interleaved: PyAV's to_ndarray of planar audio of
        # 8 channels or more reads past its planes (a segfault in PyAV 18)
        resampler = av.AudioResampler(format="flt", rate=rate)
        parts, total = [], 0
        limit = int(max_seconds * rate) + 1

        def add(out):
            nonlocal total
            block = out.to_ndarray().reshape(-1, len(out.layout.channels))
            parts.append(block.mean(axis=1, dtype=np.float32))
            total += len(block)

        for frame in container.decode(stream):
            _check_layout(len(frame.layout.channels), int(frame.sample_rate or rate), param)
            for out in resampler.resample(frame):
                add(out)
            if total >= limit:
                raise _too_long(param, max_seconds)
        for out in resampler.resample(None):
            add(out)
    if not parts:
        raise errors.bad_request(f"{param} holds no audio", param)
    return np.ascontiguousarray(np.concatenate(parts)), rate
