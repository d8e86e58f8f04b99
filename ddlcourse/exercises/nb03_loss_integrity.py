"""Exercises of notebooks/03_loss_integrity.ipynb."""
import math

from ddlcourse.selfcheck import exercise


@exercise("sum_grads_effective_lr", "summing N equal-sized gradient means gives N times the mean: the step is N times larger")
def sum_grads_effective_lr(lr: float, world_size: int) -> float:
    return lr * world_size


@exercise("sampler_padding_duplicates", "DistributedSampler pads the epoch up to the next multiple of world_size")
def sampler_padding_duplicates(n: int, world_size: int) -> int:
    return math.ceil(n / world_size) * world_size - n


@exercise("naive_loss", "each rank's mean counts equally, whatever the number of samples behind it")
def naive_loss(rank_sums: tuple, rank_counts: tuple) -> float:
    return sum(s / c for s, c in zip(rank_sums, rank_counts)) / len(rank_counts)
