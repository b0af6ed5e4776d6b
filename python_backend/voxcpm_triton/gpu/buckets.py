"""Bucket tables: a size runs in the smallest captured size that holds it (batch rows, prompt
positions, CFM loop lengths, VAE streams)."""

from __future__ import annotations

import bisect


def smallest_at_least(table, n: int) -> int | None:
    """The smallest entry of the sorted `table` that is >= n; None if n is beyond the table."""
    i = bisect.bisect_left(table, n)
    return table[i] if i < len(table) else None
