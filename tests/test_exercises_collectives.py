"""Notebook 04 (collectives): the build-it ring allreduce is checked by tests/test_build_it.py (solution accepted,
each mistake named, the template 'not written yet', on 2, 3 and 4 ranks). Here: a correct ring written another
way passes, an unknown mistake is reported with the buffer it fails on, and the timing table of the exercise."""
import pytest

from helpers import check_on_ranks


@pytest.mark.parametrize("n", [2, 3])
def test_ring_allreduce_checker_and_timing_on_ranks(n):
    p = check_on_ranks(n, "exercises_collectives_ring_allreduce")
    assert "yours (µs)" in p.stdout
