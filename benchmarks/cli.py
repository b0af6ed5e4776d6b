"""Argument types the benchmark scripts share."""

import argparse


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers ("10,100") -> (10, 100)."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers (e.g. 10,100), got {text!r}")
    return values
