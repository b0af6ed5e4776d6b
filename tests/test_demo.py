"""The README's first command, as a user runs it."""

import os
import re
import subprocess

import numpy as np
import soundfile as sf

from tests.server import REPO


def test_demo_script_synthesizes_and_writes_readable_wavs():
    for f in ("demo.wav", "demo_http.wav", "demo_openai.wav"):
        if (REPO / f).exists():
            (REPO / f).unlink()
    out = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "CI": os.environ.get("CI", "")})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "time to first audio" in log and "RTF" in log, log
    assert "time to first byte" in log, log  # the OpenAI speech API gateway, beside tritonserver
    logs = re.findall(r"starting tritonserver \(log: (\S+)\)", log)
    assert len(logs) == 1 and not os.path.exists(logs[0]), "a demo that went well leaves no log behind"
    for f in ("demo.wav", "demo_http.wav", "demo_openai.wav"):
        audio, rate = sf.read(REPO / f, dtype="float32")
        assert rate == 48000
        assert audio.ndim == 1 and audio.size >= 25 * 4 * 1920  # --min-length 25 patches
        assert np.isfinite(audio).all() and np.abs(audio).max() > 0
