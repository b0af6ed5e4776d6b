"""benchmarks/shm_regions.py: a real tritonserver (tiny checkpoint, CPU) with its own region prefix, a burst
of streams, the regions' sizes and the burst's figures; nothing of it left behind."""

import glob
import json
import re
import subprocess
import sys

from tests.conftest import require_module

require_module("tritonclient.grpc", "tritonclient[all] in requirements.txt")

from tests.server import REPO, edited_repository  # noqa: E402


def _instances(repo) -> int:
    """Model instances a CPU server starts from `repo` (KIND_AUTO: one on a machine without a GPU)."""
    return sum(int(re.search(r"count: (\d+)", cfg.read_text())[1]) for cfg in repo.glob("*/config.pbtxt"))


def _run(tmp_path, *server_args):
    out = tmp_path / "shm.json"
    repo = edited_repository(tmp_path / "repo", instances={"tts": 1})  # a repository other than the checkout's
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "shm_regions.py"), "--streams", "2", "--patches",
                           "4", "--bursts", "1", "--model-repository", str(repo), "--json-out", str(out), "--",
                           *server_args],
                          capture_output=True, text=True, timeout=600, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "shm_tritonserver.log").stat().st_size > 0  # its server's log beside its results
    return json.loads(out.read_text()) | {"instances": _instances(repo)}


def test_reports_its_own_regions_and_leaves_none(tmp_path):
    d = _run(tmp_path, "--backend-config=python,shm-default-byte-size=3145728")
    # one region per Python model instance, each at the default size it was given (3 MiB), none of another server's
    assert len(d["after_start_mib"]) == d["instances"] and set(d["after_start_mib"]) == {3}, d
    assert d["after_start_allocated_mib"] == d["after_start_mib"], d  # every page of a region is RAM from the start
    (burst,) = d["bursts"]
    assert burst["x_real_time"] > 0 and burst["ttfa_ms_p50"] > 0 and burst["delivery_ms"] > 0, burst
    assert len(burst["sizes_mib"]) == len(d["after_start_mib"]) and min(burst["sizes_mib"]) >= 3, burst
    # minor page faults in the burst, of the server and of each model's stub by its model's name
    faults = burst["minor_faults"]
    assert {"tritonserver", "decoder", "tts_stream", "tokenizer"} <= set(faults), faults
    assert faults["tritonserver"] > 0 and faults["decoder"] > 0, faults
    # resident memory after it, and of that the shared memory mapped: the regions the streams' audio went through
    shared = burst["shared_mib"]
    assert burst["resident_mib"]["tts_stream"] > 0 and shared["tts_stream"] > 0 and shared["tritonserver"] > 0, burst
    assert not glob.glob("/dev/shm/voxcpm_shm_regions_*")  # the server's regions went with it
