"""benchmarks/gpu_timeline.py: the stream-by-stream split of a profiler trace (a hand-made trace)."""

import sys

import pytest

from tests.server import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_timeline  # noqa: E402


def _ev(stream, ts, dur, name="k", cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_a_trace_splits_into_each_stream_alone_both_and_neither():
    trace = {"traceEvents": [
        # engine stream 7: [0, 100) and [105, 200) (a 5 us gap), then [400, 500) (a 200 us wait)
        _ev(7, 0, 60, "gemm"), _ev(7, 50, 50, "gemm"), _ev(7, 105, 95, "norm"), _ev(7, 400, 100, "gemm"),
        # audio stream 13: [150, 250) and [450, 470), one of them a copy
        _ev(13, 150, 100, "unit_tail"), _ev(13, 450, 20, "Memcpy DtoH", cat="gpu_memcpy"),
        # a third stream, idle time of the other two: [300, 310)
        _ev(21, 300, 10, "other"),
        # not device work: ignored
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 600, "args": {"stream": 7}},
    ]}
    t = gpu_timeline.summarize(trace, short_gap_us=20)
    assert t["wall_ms"] == pytest.approx(0.5)
    e, a = t["streams"]["7"], t["streams"]["13"]
    assert (e["events"], e["busy_ms"]) == (4, pytest.approx(0.295))
    assert (e["short_gaps_ms"], e["long_gaps_ms"], e["long_gaps"]) == (pytest.approx(0.005), pytest.approx(0.2), 1)
    assert [k["name"] for k in e["top"]] == ["gemm", "norm"]
    assert e["top"][0] == {"name": "gemm", "calls": 3, "ms": pytest.approx(0.21)}
    assert a["busy_ms"] == pytest.approx(0.12)
    s = t["split"]
    assert (s["first"], s["second"]) == ("7", "13")
    assert s["both_ms"] == pytest.approx(0.07)  # [150, 200) and [450, 470)
    assert s["first_only_ms"] == pytest.approx(0.225)
    assert s["second_only_ms"] == pytest.approx(0.05)
    assert s["neither_ms"] == pytest.approx(0.155)  # [100, 105) and [250, 400): stream 21 counts as neither
    assert s["idle_ms"] == pytest.approx(0.145)  # [100, 105), [250, 300) and [310, 400)


def test_one_long_event_against_several_short_ones_and_touching_events():
    trace = {"traceEvents": [
        _ev(1, 400, 100), _ev(1, 500, 50),  # touching: one busy stretch [400, 550), no gap
        _ev(2, 410, 10), _ev(2, 450, 20), _ev(2, 540, 30),  # inside it, and past its end
    ]}
    t = gpu_timeline.summarize(trace)
    assert (t["streams"]["1"]["busy_ms"], t["streams"]["1"]["short_gaps_ms"]) == (pytest.approx(0.15), 0.0)
    s = t["split"]
    assert (s["first"], s["second"]) == ("1", "2")
    assert s["both_ms"] == pytest.approx(0.04)  # [410, 420), [450, 470), [540, 550)
    assert s["first_only_ms"] == pytest.approx(0.11)
    assert s["second_only_ms"] == pytest.approx(0.02)  # [550, 570)
    assert s["neither_ms"] == pytest.approx(0.0) and t["wall_ms"] == pytest.approx(0.17)


def test_a_trace_without_device_work_summarizes_to_nothing():
    assert gpu_timeline.summarize({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 5}]}) == \
        {"streams": {}, "wall_ms": 0.0}
