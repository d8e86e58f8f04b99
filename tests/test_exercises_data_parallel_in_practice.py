"""Notebook 06's build-it exercise beyond what tests/test_build_it.py runs (the reference accepted, each registered
mistake named, the template 'not written yet'): the package's ``dp.accumulate_step`` (what the notebook's demo
runs) and learners' other right ways pass; the checker names a few more mistakes."""
from helpers import check_on_ranks


def test_accumulate_step_checker_beyond_the_registered_mistakes():
    check_on_ranks(2, "exercises_data_parallel_in_practice_accumulate")
