"""benchmarks/cli.py: the argument types the benchmark scripts share."""

import argparse
import sys

import pytest

from tests.server import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import cli  # noqa: E402


def test_int_list_takes_positive_integers_and_names_what_it_refuses():
    assert cli.int_list("10,100") == (10, 100) and cli.int_list("3") == (3,)
    for bad in ("", "10,x", "0,100", "-1", "10,,100"):
        with pytest.raises(argparse.ArgumentTypeError, match="comma-separated positive integers"):
            cli.int_list(bad)


def test_timestep_buckets_are_checked_as_the_engine_checks_them():
    assert cli.timestep_buckets("10,100") == (10, 100)
    with pytest.raises(argparse.ArgumentTypeError, match="sorted and unique"):
        cli.timestep_buckets("100,10")
    with pytest.raises(argparse.ArgumentTypeError, match="must end at the largest"):
        cli.timestep_buckets("10")


def test_batch_buckets_are_checked_as_the_engine_checks_them():
    assert cli.batch_buckets("2,4,8") == (2, 4, 8) and cli.batch_buckets("1") == (1,)
    with pytest.raises(argparse.ArgumentTypeError, match="batch_buckets must be sorted and unique"):
        cli.batch_buckets("4,2")


def test_launch_field_takes_a_launch_field_and_a_literal():
    assert cli.launch_field("swap=True") == ("swap", True)
    assert cli.launch_field("blocks=(64, 64, 32, 64)") == ("blocks", (64, 64, 32, 64))
    for bad, match in (("swap", "FIELD=VALUE"), ("swapped=True", "FIELD=VALUE"),
                       ("prefetch=two", "not a Python literal")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            cli.launch_field(bad)
