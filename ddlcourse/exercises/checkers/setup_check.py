"""Checkers of notebooks/00_setup_check.ipynb: the reference answers of its questions (no coding exercise)."""
from ddlcourse.selfcheck import exercise


@exercise("allreduce_sum", "rank r contributes r + 1, so the sum over N ranks is 1 + 2 + ... + N")
def allreduce_sum(n_ranks: int) -> float:
    return n_ranks * (n_ranks + 1) / 2


@exercise("allreduce_mean", "the mean is the sum divided by the number of ranks")
def allreduce_mean(n_ranks: int) -> float:
    return (n_ranks + 1) / 2
