"""Import the official ``voxcpm`` 2.0.3 package, the parity reference.

It is a test dependency, installed with ``--no-deps`` (see scripts/setup.sh).
``voxcpm.model`` also imports the VoxCPM 1 model, which needs ``torchaudio``
at import time only; VoxCPM2 never calls it, and no torchaudio build matches
the torch we run, so a placeholder module stands in for it.
"""

import importlib.machinery
import sys
import types


def _placeholder_torchaudio():
    if "torchaudio" in sys.modules:
        return
    try:
        import torchaudio  # noqa: F401
    except Exception:
        mod = types.ModuleType("torchaudio")
        mod.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = mod


def voxcpm2_module():
    """The reference ``voxcpm.model.voxcpm2`` module."""
    _placeholder_torchaudio()
    import voxcpm.model.voxcpm2 as ref

    return ref


def reference_utils():
    _placeholder_torchaudio()
    import voxcpm.model.utils as utils

    return utils


def text_normalizer():
    """A reference ``voxcpm.utils.text_normalize.TextNormalizer`` (what ``generate(normalize=True)`` uses)."""
    _placeholder_torchaudio()
    from voxcpm.utils.text_normalize import TextNormalizer

    return TextNormalizer()
