#!/usr/bin/env python3
"""Run tritonserver and keep it serving (restarts, probes, a clean stop, companions such as the
OpenAI gateway). The supervisor lives in python_backend/voxcpm_triton/supervisor (its package
docstring says what it does); standard library only, no torch.

    python3 scripts/supervise.py [options] -- tritonserver --model-repository=... [args]
    python3 scripts/supervise.py --help
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.supervisor.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
