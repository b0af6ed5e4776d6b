import ast
import copy
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

if not torch.cuda.is_available():
    # The Triton kernels' tests run under triton's CPU interpreter, which is chosen when triton is
    # first imported: set it before any test module (or code under test) can import triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, _rope, write_checkpoint  # noqa: E402  (after TRITON_INTERPRET)


def pytest_sessionfinish(session, exitstatus):
    """A session that passed leaves none of the logs its servers made in the temporary directory."""
    if exitstatus == 0:
        from tests.server import OWN_LOGS

        for path in OWN_LOGS:
            path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _gc_unfrozen():
    """Models initialised in the test process (tests/test_serving_models.py) freeze what it holds
    (serving/gc_pauses): thaw it after each test, so that no test leaves its objects uncollected."""
    yield
    import gc

    if gc.get_freeze_count():
        gc.unfreeze()


def variant_config() -> dict:
    """Exercises what the real-shaped config leaves off: muP scaling, RoPE in the
    residual LM, patch size 2, head dim from hidden/heads, non-trivial LongRoPE factors."""
    cfg = copy.deepcopy(TINY_CONFIG)
    lm = cfg["lm_config"]
    del lm["kv_channels"]  # head dim = hidden / heads
    lm.update(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1,
              use_mup=True, scale_emb=12, scale_depth=1.4, max_position_embeddings=2048,
              rope_scaling=_rope(12, 1024))
    # LocEnc/LocDiT heads must share the LM's RoPE factor length (head dim 12).
    lm["rope_scaling"]["long_factor"] = [1.0 + 0.1 * i for i in range(6)]
    lm["rope_scaling"]["short_factor"] = [1.0 + 0.05 * i for i in range(6)]
    cfg.update(patch_size=2, residual_lm_no_rope=False, residual_lm_num_layers=3, max_length=1024,
               scalar_quantization_latent_dim=16, scalar_quantization_scale=5)
    cfg["encoder_config"] = {"hidden_dim": 24, "ffn_dim": 40, "num_heads": 2, "num_layers": 2, "kv_channels": 12}
    cfg["dit_config"].update(hidden_dim=36, ffn_dim=50, num_heads=3, num_layers=3, kv_channels=12)
    cfg["audio_vae_config"] = {"encoder_dim": 4, "encoder_rates": [2, 4, 5], "latent_dim": 16, "decoder_dim": 32,
                               "decoder_rates": [5, 4, 2], "depthwise": False, "sr_bin_boundaries": None,
                               "sample_rate": 16000, "out_sample_rate": 16000}
    return cfg


CONFIGS = {"real_shaped": TINY_CONFIG, "variant": variant_config()}


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        out[name] = write_checkpoint(str(tmp_path_factory.mktemp(f"ckpt_{name}")), cfg, seed=7, progress=None)
    return out


def sine_wave(seconds: float, rate: int, freq: float = 220.0, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.4 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


# What scripts/setup.sh installs is no optional extra: a test that needs it fails when it is
# missing (setup.sh is broken, or was not run), where a skip would hide exactly that.
def require_module(name: str, source: str):
    """Import `name`, which setup.sh installs from `source`; fail the test (or module) if it cannot."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"cannot import {name} ({e}): scripts/setup.sh should have installed it ({source}); "
                    "run scripts/setup.sh", pytrace=False)


def skip_unless_kernels_run(kernels):
    """Module level: skip unless the Triton kernels of module `kernels` can run here, on a GPU or
    under Triton's CPU interpreter (set above, which works only if triton was not imported first)."""
    if not torch.cuda.is_available() and not kernels._INTERPRETED:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run with TRITON_INTERPRET=1",
                    allow_module_level=True)


def assert_standalone_without_torch(module, use: str):
    """`module` imports neither torch nor anything of the package (read from its source), and,
    loaded alone from its file in a fresh interpreter as `m`, the Python in `use` runs and torch
    stays unloaded."""
    path = Path(module.__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] not in ("torch", "voxcpm_triton") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module.split(".")[0] not in ("torch", "voxcpm_triton"), node.module
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('{path.stem}_alone', {str(path)!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
            f"{use}\n"
            "assert 'torch' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def require_executable(name: str, source: str) -> str:
    """The path of executable `name`, which setup.sh installs from `source`; fail if it is not on PATH."""
    exe = shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not on PATH: scripts/setup.sh should have installed it ({source}); "
                    "run scripts/setup.sh", pytrace=False)
    return exe
