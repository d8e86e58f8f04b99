"""Exercises of notebooks/10_model_parallel.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("naive_idle_fraction", "one stage works at a time: each rank works 1/p of the time")
def naive_idle_fraction(num_stages: int) -> float:
    return (num_stages - 1) / num_stages


@exercise("model_parallel_messages", "p-1 boundaries, one activation forward and one gradient backward across each")
def model_parallel_messages(num_stages: int) -> int:
    return 2 * (num_stages - 1)
