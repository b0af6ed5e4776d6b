"""benchmarks/page_faults.py: a process tree's faults and memory from /proc by name, and faults between two
readings counted per process, so that a process started (or ended) between them does not skew the sums."""

import os
import subprocess
import sys
import time

import pytest

from tests.server import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import page_faults  # noqa: E402


def test_a_tree_by_name_with_its_memory():
    child = subprocess.Popen(["sleep", "30"])
    try:
        for _ in range(100):  # until the child has exec'd sleep
            if "sleep" in page_faults.usage(os.getpid()):
                break
            time.sleep(0.01)
        now = page_faults.usage(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert "sleep" in now and len(now) >= 2, now  # this process and its child
    assert [pid for pid, _ in now["sleep"]["processes"]] == [child.pid], now["sleep"]
    for u in now.values():
        assert u["minor_faults"] > 0 and u["resident_mib"] > 0, u
    assert page_faults.by("resident_mib", now)["sleep"] == now["sleep"]["resident_mib"]


def test_no_such_process_reads_empty():
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert page_faults.usage(dead.pid) == {}


def test_delta_counts_a_restarted_process_from_its_start():
    before = {"tts_stream": {"processes": {(11, 100): 500, (12, 100): 400}},
              "tritonserver": {"processes": {(10, 90): 1000}}}
    # instance 12 died and came back as 13; the server went on
    after = {"tts_stream": {"processes": {(11, 100): 530, (13, 300): 20}},
             "tritonserver": {"processes": {(10, 90): 1100}},
             "decoder": {"processes": {(14, 310): 7}}}
    assert page_faults.delta(before, after) == {"tritonserver": 100, "tts_stream": 50, "decoder": 7}
    # a process read under another name before (a stub forked by the server, not yet exec'd)
    before["tritonserver"]["processes"][(15, 320)] = 40
    after["tts_stream"]["processes"][(15, 320)] = 90
    assert page_faults.delta(before, after)["tts_stream"] == 50 + 50


def test_bench_served_refuses_a_server_pid_not_on_this_machine():
    dead = subprocess.Popen(["true"])
    dead.wait()
    from bench_served import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--server-pid", str(dead.pid)])
    assert parse_args(["--server-pid", str(os.getpid())]).server_pid == os.getpid()
