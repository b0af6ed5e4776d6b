"""Argument types the benchmark scripts share."""

import argparse
import ast


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive integers ("10,100") -> (10, 100)."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers (e.g. 10,100), got {text!r}")
    return values


def timestep_buckets(text: str) -> tuple[int, ...]:
    """argparse type: CFM loop buckets as the engine takes them ("10,100"), checked before any model loads."""
    from voxcpm_triton.engine.step_runner import check_timestep_buckets  # the scripts put python_backend on the path

    try:
        return check_timestep_buckets(int_list(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def batch_buckets(text: str) -> tuple[int, ...]:
    """argparse type: batch buckets as the engine takes them ("2,4,8")."""
    from voxcpm_triton.engine.step_runner import check_batch_buckets  # the scripts put python_backend on the path

    try:
        return check_batch_buckets(int_list(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def launch_field(text: str) -> tuple:
    """argparse type: a `persistent_layer.Launch` field changed, "FIELD=VALUE" (a Python literal:
    swap=True, blocks=(64, 64, 32, 64)) -> (field, value); an unknown field or value is a usage error."""
    from voxcpm_triton.kernels.persistent_layer import Launch  # the scripts put python_backend on the path

    field, sep, value = text.partition("=")
    if not sep or field not in Launch._fields:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD one of {', '.join(Launch._fields)}, "
                                         f"got {text!r}")
    try:
        return field, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{field}: {value!r} is not a Python literal") from None
