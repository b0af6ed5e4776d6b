"""benchmarks/request_phases.py: a served request's phases from the timing probe's files (hand-made)."""

import gzip
import json
import subprocess
import sys

import pytest

from tests.server import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import request_phases  # noqa: E402


def _write(path, lines):
    path.write_text("".join(f"{t:.6f} {thread} {' '.join(map(str, rest))}\n" for t, thread, *rest in lines))


def _probe(tmp_path):
    """Two requests in a level from t=100 to t=101 and one outside it: the orchestrator's and the decoder's
    files, events out of order across the files as the processes wrote them."""
    orch, dec = [], []
    for rid, t0, k in (("r1", 100.0, 1), ("r2", 100.2, 2), ("late", 105.0, 1)):
        ms = lambda x: t0 + x / 1e3  # noqa: E731
        orch += [(ms(1), "Thread-1", "odec", rid, f"{t0:.6f}"), (ms(40 * k), "Thread-1", "oemit", rid, 1),
                 (ms(200), "Thread-1", "oemit", rid, 15), (ms(230), "Thread-1", "oend", rid)]
        dec += [(ms(2), "MainThread", "exec", rid), (ms(3), "MainThread", "sub", rid),
                (ms(3 + 5 * k), "voxcpm-engine", "adm", rid, f"{ms(3):.6f}", 1),
                (ms(10 * k), "voxcpm-engine", "pre", rid), (ms(11 * k), "voxcpm-engine", "l0", rid),
                (ms(30 * k), "voxcpm-engine", "chunk", rid, 1, 1, None),
                (ms(38 * k), "voxcpm-stream-audio", "asent", rid, 1),
                (ms(150), "voxcpm-engine", "chunk", rid, 2, 15, "max_len"),
                (ms(190), "voxcpm-stream-audio", "asent", rid, 15),
                (ms(192), "voxcpm-stream-audio", "aend", rid)]
    dec += [(100.5, "voxcpm-engine", "step", 2), (100.52, "voxcpm-engine", "step", 1),
            (100.6, "voxcpm-stream-audio", "rtake", 2, 2), (100.601, "voxcpm-stream-audio", "asent", "x", 1),
            (100.603, "voxcpm-stream-audio", "asent", "y", 1), (100.61, "voxcpm-stream-audio", "rdone")]
    # a second decoder instance's audio thread, its round overlapping the first's: counted on its own
    other = [(100.6012, "voxcpm-stream-audio", "rtake", 1, 1), (100.602, "voxcpm-stream-audio", "asent", "z", 1),
             (100.6052, "voxcpm-stream-audio", "rdone")]
    _write(tmp_path / "probe-1.txt", orch)
    _write(tmp_path / "probe-2.txt", dec)
    _write(tmp_path / "probe-3.txt", other)
    served = {"levels": [{"concurrency": 2, "t_origin_monotonic": 100.0, "wall_s": 1.0, "x_real_time": 9.0}]}
    with gzip.open(tmp_path / "served.json.gz", "wt") as f:
        json.dump(served, f)


def test_phases_of_a_level_are_its_requests_medians(tmp_path):
    _probe(tmp_path)
    events = request_phases.load_events(str(tmp_path))
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    reqs = request_phases.requests_of(events)
    lv = request_phases.level_phases(events, reqs, 100.0, 101.0)
    assert lv["requests"] == 2  # "late" started past the level's end
    p = lambda name: lv["phases"][name]["p50_ms"]  # noqa: E731
    assert p("decoder call -> execute") == pytest.approx(1.0)
    assert p("submitted -> admitted") == pytest.approx(7.5)  # 5 and 10
    assert p("first step launched -> first chunk") == pytest.approx(28.5)  # 19 and 38
    assert p("first chunk -> its audio sent") == pytest.approx(12.0)  # 8 and 16
    assert p("first audio in the orchestrator") == pytest.approx(60.0)  # 40 and 80
    assert p("last chunk -> its audio sent") == pytest.approx(40.0)
    assert p("last audio sent -> end sent") == pytest.approx(2.0)
    assert p("end sent -> orchestrator's end") == pytest.approx(38.0)
    assert lv["phases"]["submitted -> admitted"]["p90_ms"] == pytest.approx(5.0)  # the lower of two, by index
    assert (lv["steps"], lv["rows_per_step"]) == (2, 1.5)
    assert (lv["audio_rounds"], lv["audio_sends"]) == (2, 3)  # the requests' own sends fall outside any round
    assert lv["audio_busy_s"] == pytest.approx(0.014)  # 10 ms and 4 ms
    assert lv["send_gap"] == {"p50_ms": pytest.approx(2.0), "p90_ms": pytest.approx(2.0), "n": 1}  # x to y only


def test_the_script_prints_and_writes_each_level(tmp_path):
    _probe(tmp_path)
    out = tmp_path / "phases.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "request_phases.py"), str(tmp_path / "served.json.gz"),
                          str(tmp_path), "--json-out", str(out)], capture_output=True, text=True, check=True)
    assert "== 2 streams: 2 requests, 2 steps" in run.stdout
    assert json.loads(out.read_text())["2"]["phases"]["last audio sent -> end sent"]["p50_ms"] == pytest.approx(2.0)
