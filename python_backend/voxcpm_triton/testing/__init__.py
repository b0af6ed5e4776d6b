"""Test-fixture generators: a random-weight checkpoint, its tokenizer, and a random LoRA adapter.

The server reaches this package only through `ensure_tiny_checkpoint`, to generate the embedded
tiny checkpoint when it is missing.
"""

from __future__ import annotations


def ensure_tiny_checkpoint(path: str | None = None, progress=None) -> str:
    """The embedded default checkpoint (`paths.DEFAULT_TINY_DIR` unless `path`), generated on first
    use. Imports torch: only when called."""
    from .checkpoint_writer import ensure_tiny_checkpoint as ensure

    return ensure(path, progress)
