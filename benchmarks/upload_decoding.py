"""What decoding a voice upload in a child process costs the OpenAI gateway, against decoding it in
the gateway's own process (gateway/voxcpm_gateway/upload_decoder.py, audio_decoding.py).

    PYTHONPATH=gateway .venv/bin/python benchmarks/upload_decoding.py --out benchmarks/raw/upload_decoding.json

Uploads made here: 10 s of mono 48 kHz WAV, 10 s of stereo 44.1 kHz MP3 (libsndfile), 10 s of stereo
16 kHz AAC in MP4 (PyAV), and 59 s of 8-channel 384 kHz FLAC silence (0.2 MB, the slowest upload in
bounds). Each decoded --reps times each way, after one untimed run (the child's forkserver starts
on the first); medians in ms.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time

import numpy as np


def uploads() -> dict[str, bytes]:
    import av
    import soundfile as sf

    rng = np.random.default_rng(0)
    out = {}
    buf = io.BytesIO()
    sf.write(buf, (0.1 * rng.standard_normal(480000)).astype(np.float32), 48000, format="WAV", subtype="PCM_16")
    out["wav_mono_48k_10s"] = buf.getvalue()
    buf = io.BytesIO()
    sf.write(buf, (0.1 * rng.standard_normal((441000, 2))).astype(np.float32), 44100, format="MP3")
    out["mp3_stereo_44k_10s"] = buf.getvalue()
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("aac", rate=16000, layout="stereo")
        x = (0.1 * rng.standard_normal((2, 160000))).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(x, format="fltp", layout="stereo")
        frame.sample_rate = 16000
        for p in [*s.encode(frame), *s.encode(None)]:
            c.mux(p)
    out["m4a_stereo_16k_10s"] = buf.getvalue()
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=384000, channels=8, format="FLAC", subtype="PCM_16") as f:
        for _ in range(59):
            f.write(np.zeros((384000, 8), np.float32))
    out["flac_8ch_384k_59s_silence"] = buf.getvalue()
    return out


def timed(fn, data: bytes, reps: int) -> float:
    fn(data, 60.0)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(data, 60.0)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out")
    args = ap.parse_args()
    from voxcpm_gateway import audio_decoding
    from voxcpm_gateway.upload_decoder import UploadDecoder

    child = UploadDecoder(timeout_s=60)
    rows = {}
    for name, data in uploads().items():
        in_process = timed(audio_decoding.decode, data, args.reps)
        in_child = timed(child.decode, data, args.reps)
        rows[name] = {"bytes": len(data), "in_process_ms": in_process, "in_child_ms": in_child,
                      "extra_ms": in_child - in_process}
        print(f"{name:28s} {len(data) / 1e6:6.2f} MB  in process {in_process:8.1f} ms  in a child {in_child:8.1f} ms"
              f"  (+{in_child - in_process:.1f})", flush=True)
    result = {"reps": args.reps, "python": sys.version.split()[0], "uploads": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
