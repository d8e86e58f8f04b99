"""Exercises of notebooks/11_pipeline.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("bubble_fraction", "(p - 1) / (m + p - 1)")
def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


@exercise("min_micro_batches", "solve (p - 1) / (m + p - 1) <= b for m and round up")
def min_micro_batches(num_stages: int, max_bubble: float) -> int:
    m = 1
    while (num_stages - 1) / (m + num_stages - 1) > max_bubble + 1e-12:
        m += 1
    return m
