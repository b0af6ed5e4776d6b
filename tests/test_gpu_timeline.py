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
    assert s["first_long_gaps_second_busy_ms"] == pytest.approx(0.05)  # stream 7's gap [200, 400) vs [150, 250)


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


def _call(tid, ts, dur, corr, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {"correlation": corr}}


def _kernel(stream, ts, dur, corr):
    ev = _ev(stream, ts, dur)
    ev["args"]["correlation"] = corr
    return ev


def test_long_gaps_split_into_the_hosts_part_and_the_devices():
    trace = {"traceEvents": [
        _kernel(7, 0, 100, 1), _call(11, -10, 5, 1),
        # gap [100, 300): its kernel's launch began at 250 on thread 11, which sat in a sync over
        # [120, 180): 150 us the host's (60 of them in the sync), 50 the device's
        _kernel(7, 300, 100, 2), _call(11, 250, 10, 2, "cudaGraphLaunch"),
        _call(11, 120, 60, 99, "cudaEventSynchronize"),
        # gap [400, 500): launched at 350, before the gap: all the device's (an event wait)
        _kernel(7, 500, 50, 3), _call(22, 350, 5, 3),
        # gap [550, 600): launched by thread 22 at 700, after the event began: the host's part
        # stops at the gap's end
        _kernel(7, 600, 10, 4), _call(22, 700, 5, 4),
        # gap [610, 640): its kernel has no runtime call in the trace
        _kernel(7, 640, 10, 5),
        # a short gap [650, 655) is not split
        _kernel(7, 655, 10, 6), _call(11, 640, 1, 6),
        # one launch (a graph's kernels, correlation 7) queued at 690: gap [665, 700) 25 us the host's
        # and 10 the device's; gap [710, 750) inside that launch, all the device's
        _call(11, 690, 1, 7), _kernel(7, 700, 10, 7), _kernel(7, 750, 10, 7),
    ]}
    c = gpu_timeline.summarize(trace, short_gap_us=20)["streams"]["7"]["long_gaps_by_cause"]
    assert c["host_ms"] == pytest.approx(0.225)  # 150 + 50 + 25
    assert c["device_ms"] == pytest.approx(0.2)  # 50 + 100 + 10 + 40
    assert c["unmatched_ms"] == pytest.approx(0.03)
    assert c["host_in_sync_ms"] == pytest.approx(0.06)
    assert c["within_one_launch_ms"] == pytest.approx(0.04)
    assert c["host_ms_by_thread"] == {"11": pytest.approx(0.175), "22": pytest.approx(0.05)}
    assert c["next_launched_by"] == {"cudaGraphLaunch": 1, "cudaLaunchKernel": 4}


def test_without_runtime_calls_the_gaps_are_not_split():
    t = gpu_timeline.summarize({"traceEvents": [_kernel(7, 0, 10, 1), _kernel(7, 100, 10, 2)]})
    assert "long_gaps_by_cause" not in t["streams"]["7"]
