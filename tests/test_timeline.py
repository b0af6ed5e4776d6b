"""timeline: the opt-in event record the served benchmarks line up with their clients' times."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BACKEND = str(Path(__file__).resolve().parents[1] / "python_backend")
SCRIPT = """
import threading, time
from voxcpm_triton import timeline
timeline.event("a", 1)
t = threading.Thread(target=lambda: timeline.event("b", ["x", 2]), name="other")
t.start(); t.join()
timeline.flush()
timeline.event("c")
time.sleep(1.5)  # the writer thread's turn
print(time.monotonic())
"""


def _run(env_extra: dict, cwd) -> float:
    env = {k: v for k, v in os.environ.items() if k != "VOXCPM_TIMELINE"} | {"PYTHONPATH": BACKEND} | env_extra
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=60, check=True)
    return float(out.stdout.split()[-1])


def test_events_go_to_a_file_per_process_on_the_monotonic_clock(tmp_path):
    before = time.monotonic()
    end = _run({"VOXCPM_TIMELINE": str(tmp_path / "tl")}, tmp_path)
    files = list((tmp_path / "tl").iterdir())
    assert len(files) == 1 and files[0].suffix == ".jsonl"
    events = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [(e[1] == "other", e[2], e[3]) for e in events] == [(False, "a", 1), (True, "b", ["x", 2]), (False, "c", None)]
    times = [e[0] for e in events]
    assert before <= times[0] <= times[1] <= times[2] <= end  # one clock across processes


def test_off_by_default_it_writes_nothing(tmp_path):
    _run({}, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_cannot_be_written_turns_it_off_without_failing_the_caller(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    script = ("from voxcpm_triton import timeline\n"
              "timeline.event('a', 1); timeline.event('b', 2); timeline.flush()\n"
              "print(timeline.ON)\n")
    env = {k: v for k, v in os.environ.items() if k != "VOXCPM_TIMELINE"} | {"PYTHONPATH": BACKEND,
                                                                           "VOXCPM_TIMELINE": str(blocker / "tl")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    assert out.stdout.split()[-1] == "False" and "the timeline is off" in out.stderr
