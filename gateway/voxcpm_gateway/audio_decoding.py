"""Uploaded voice samples (any common format) -> a mono float32 waveform and its rate.

libsndfile (soundfile) reads WAV, FLAC, Ogg Vorbis/Opus and MP3 exactly as the project's
client does (channels averaged); anything else FFmpeg knows (m4a/AAC, webm, mp4, ...) goes
through PyAV. Decoding stops past `max_seconds`, so a small compressed file cannot expand
into unbounded memory.
"""

from __future__ import annotations

import io

import numpy as np

from . import errors


def decode(data: bytes, max_seconds: float, param: str = "audio_sample") -> tuple[np.ndarray, int]:
    if not data:
        raise errors.bad_request(f"{param} is empty", param)
    try:
        return _soundfile(data, max_seconds, param)
    except errors.APIError:
        raise
    except Exception:  # noqa: BLE001 - not a format libsndfile reads: try FFmpeg
        pass
    try:
        return _pyav(data, max_seconds, param)
    except errors.APIError:
        raise
    except Exception as e:  # noqa: BLE001 - neither could read it
        raise errors.bad_request(f"{param} could not be decoded as audio: {e}", param) from None


def _too_long(param: str, max_seconds: float) -> errors.APIError:
    return errors.bad_request(f"{param} is longer than {max_seconds:g} s", param)


def _soundfile(data: bytes, max_seconds: float, param: str):
    import soundfile as sf

    with sf.SoundFile(io.BytesIO(data)) as f:
        rate = int(f.samplerate)
        limit = int(max_seconds * rate) + 1
        audio = f.read(frames=limit, dtype="float32", always_2d=True)
    if len(audio) >= limit:
        raise _too_long(param, max_seconds)
    return np.ascontiguousarray(audio.mean(axis=1, dtype=np.float32)), rate


def _pyav(data: bytes, max_seconds: float, param: str):
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise errors.bad_request(f"{param} has no audio stream", param)
        stream = container.streams.audio[0]
        rate = int(stream.codec_context.sample_rate or stream.rate or 0)
        # float planar, rate and channels as they are; channels averaged below
        resampler = av.AudioResampler(format="fltp", rate=rate)
        parts, total = [], 0
        limit = int(max_seconds * rate) + 1
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                block = out.to_ndarray()
                parts.append(block.mean(axis=0, dtype=np.float32))
                total += block.shape[1]
            if total >= limit:
                raise _too_long(param, max_seconds)
        for out in resampler.resample(None):
            parts.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
    if not parts or not rate:
        raise errors.bad_request(f"{param} holds no audio", param)
    return np.ascontiguousarray(np.concatenate(parts)), rate
