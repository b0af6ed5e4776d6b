"""benchmarks/results.md and results.json are what benchmarks/summarize.py makes from benchmarks/raw/:
a number edited by hand, a raw file changed or removed, or a section's code changed without
regenerating them fails here. Also that every plot results.md shows is drawn."""

import itertools
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"


def test_results_are_what_summarize_makes_from_raw(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "summarize.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("results.md", "results.json"):
        made, committed = (tmp_path / name).read_text(), (BENCH / name).read_text()
        if made != committed:
            diff = next(i for i, (a, b) in enumerate(itertools.zip_longest(made.split("\n"), committed.split("\n")))
                        if a != b)
            raise AssertionError(f"{name} differs from what summarize.py makes, first at line {diff + 1}: "
                                 f"regenerate it (.venv/bin/python benchmarks/summarize.py)")
    shown = set(re.findall(r"\]\((results\w*\.png)\)", (BENCH / "results.md").read_text()))
    assert len(shown) > 20
    for png in shown:  # drawn by this run, and committed
        assert (tmp_path / png).stat().st_size > 10_000 and (BENCH / png).is_file(), png
