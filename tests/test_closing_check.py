"""benchmarks/closing_check.sh, the GPU check a change is closed with: its list of GPU test files
keeps up with the tests, and a failing test file or gpu_check fails it (run here with stand-ins for
python3 and nvidia-smi; the real run is on the GPU, recorded in benchmarks/results.md)."""

import os
import re
import stat
import subprocess
import tarfile

from tests.server import REPO

SCRIPT = REPO / "benchmarks" / "closing_check.sh"


def listed() -> set:
    m = re.search(r'GPU_TESTS="\$\{GPU_TESTS:-([^}]*)\}"', SCRIPT.read_text())
    return set(m[1].split())


def test_it_lists_every_test_file_that_needs_cuda():
    others = [p for p in (REPO / "tests").glob("test_*.py") if p.name != os.path.basename(__file__)]
    needs_cuda = {p.stem[len("test_"):] for p in others if "torch.cuda.is_available()" in p.read_text(encoding="utf-8")}
    assert needs_cuda, "no test file asks for CUDA: the rule found nothing"
    assert needs_cuda <= listed(), f"GPU test files closing_check.sh misses: {sorted(needs_cuda - listed())}"
    assert all((REPO / "tests" / f"test_{f}.py").exists() for f in listed()), listed()


def _stand_ins(tmp_path, failing: str):
    """python3 and nvidia-smi that answer as a GPU machine would; pytest fails on `failing`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"""#!/usr/bin/env bash
case "$*" in
    *find_spec*voxcpm*) exit 1 ;;
    *gpu_check.py*) echo "gpu_check: $GPU_CHECK"; [[ $GPU_CHECK == passes ]]; exit $? ;;
    *tests/test_{failing}.py*) echo "1 failed, 2 passed in 0.1s"; exit 1 ;;
    *pytest*) echo "3 passed in 0.1s"; exit 0 ;;
esac
echo "unexpected: $*" >&2; exit 3
""")
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'Stand-in GPU'\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
            "CKPT": str(tmp_path / "ckpt"), "GPU_TESTS": "alpha beta audio_vae", "GPU_CHECK": "passes"}


def test_a_failing_test_file_fails_it_and_a_passing_run_passes(tmp_path):
    env = _stand_ins(tmp_path, failing="beta")
    p = subprocess.run(["bash", str(SCRIPT), "tests"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "[closing] beta failed (exit 1)" in p.stdout and "alpha failed" not in p.stdout, p.stdout
    assert "test_audio_vae.py left out: the official voxcpm package is not installed here" in p.stdout
    assert "gpu_check failed" not in p.stdout
    assert "alpha: 3 passed in 0.1s" in p.stdout and "beta: 1 failed, 2 passed in 0.1s" in p.stdout
    assert p.stdout.rstrip().endswith("Stand-in GPU")
    (tmp_path / "second").mkdir()
    env = _stand_ins(tmp_path / "second", failing="nothing")
    p = subprocess.run(["bash", str(SCRIPT), "tests"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "failed" not in p.stdout, p.stdout + p.stderr
    with tarfile.open(tmp_path / "second" / "out" / "tests.tgz") as tar:
        assert tar.extractfile("t/gpu_tests_alpha.txt").read() == b"3 passed in 0.1s\n"
        assert sorted(tar.getnames()) == ["t", "t/gpu_check.log", "t/gpu_tests_alpha.txt", "t/gpu_tests_beta.txt"]
    assert not (tmp_path / "second" / "out" / "t").exists()
    p = subprocess.run(["bash", str(SCRIPT), "tests"], cwd=REPO, env={**env, "GPU_CHECK": "fails"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "[closing] gpu_check failed (exit 1)" in p.stdout, p.stdout + p.stderr


def test_it_says_how_to_call_it():
    p = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr == "usage: bash benchmarks/closing_check.sh tests|served\n"
