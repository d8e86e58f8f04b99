"""Notebook 19's coding exercises beyond what tests/test_build_it.py runs (the registered solutions and
mistakes): a ZeRO-1 step that keeps every gradient, and ZeRO-3 layers that keep the full weight in ways the
registered mistakes do not."""
from helpers import check_on_ranks


def test_zero1_step_names_a_kept_gradient():
    check_on_ranks(2, "exercises_sharded_data_parallel_zero1")


def test_sharded_linear_sees_a_full_weight_kept_elsewhere():
    check_on_ranks(3, "exercises_sharded_data_parallel_sharded_linear")
