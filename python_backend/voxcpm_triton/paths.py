"""Project paths that light (torch-free) processes need too."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The embedded default checkpoint, generated on first use (scripts/make_tiny_checkpoint.py).
DEFAULT_TINY_DIR = os.environ.get("VOXCPM_TINY_DIR") or os.path.join(REPO_ROOT, "checkpoints", "tiny")
