#!/usr/bin/env python3
"""Liveness probe: one real, tiny synthesis through `tts_stream` (the container's healthcheck). The
probe lives in python_backend/voxcpm_triton/supervisor/probe.py; standard library only.

    python3 scripts/probe.py [--url http://127.0.0.1:8000] [--timeout 60] [--metrics-url http://127.0.0.1:8002]

Exit status: 0 healthy, 1 not healthy, 2 broken (a model process is dead: restart the server now).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python_backend"))
from voxcpm_triton.supervisor.probe import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
