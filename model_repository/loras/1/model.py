"""Triton entry point for `loras`: the decoder's LoRA adapters. The logic lives in python_backend/voxcpm_triton/serving/."""

import os
import sys

sys.path.insert(0, os.environ.get("VOXCPM_PYTHON_BACKEND") or
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python_backend"))

from voxcpm_triton.coordination import runtime  # noqa: E402

runtime.skip_teardown_at_exit()  # first: before torch is imported (see its doc)

from voxcpm_triton.serving.loras_model import LorasModel as TritonPythonModel  # noqa: E402,F401
