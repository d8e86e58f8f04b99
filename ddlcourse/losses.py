"""A loss that means the same on 1 and on N ranks.

The serial loss of a global batch of ``M`` samples is ``L = (1/M) * sum_i l_i``. Split over ``world_size``
ranks, rank ``r`` holds ``m_r`` of the samples. The common shortcut, each rank's own mean
``(1/m_r) * sum_{i in r} l_i`` followed by the mean over ranks (what DDP and Horovod do with gradients),
weights every *rank* equally: correct only when every ``m_r = M / world_size``. When the shares differ
(an uneven last batch, a global batch that does not divide by the ranks), samples on the smaller shares
count more.

The fix: rank ``r`` uses ``world_size * sum_{i in r} l_i / M``. Its mean over the ranks is exactly ``L``,
so averaging the gradients over the ranks (DDP, Horovod, ``average_gradients``) gives the serial gradient.
(Equivalently: ``sum_{i in r} l_i / M`` with the gradients *summed* over ranks.)
"""
from __future__ import annotations

import torch
import torch.distributed as tdist


def global_count(local_count: int, group=None) -> int:
    """``M``: the number of samples in the global batch, summed over the ranks of ``group``."""
    if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size(group) == 1:
        return int(local_count)
    t = torch.tensor([float(local_count)], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM, group=group)
    return int(t.item())


def global_mean_loss(per_sample: torch.Tensor, global_count: int, world_size: int) -> torch.Tensor:
    """This rank's share of the global-mean loss, scaled for gradient *averaging* over ``world_size`` ranks.

    ``per_sample``: (m_r,) losses of this rank's samples (``reduction="none"``), possibly empty.
    Returns ``world_size * per_sample.sum() / global_count``; the mean over the ranks is the serial loss.
    """
    if global_count < 1:
        raise ValueError(f"global_count must be >= 1 (the samples in the global batch), got {global_count}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if per_sample.dim() != 1:
        raise ValueError(f"per_sample must hold one loss per sample, shape (m,), got {tuple(per_sample.shape)}")
    return per_sample.sum() * (world_size / global_count)


def naive_mean_loss(per_sample: torch.Tensor) -> torch.Tensor:
    """The shortcut (each rank's own mean): correct only when every rank holds the same number of samples."""
    return per_sample.mean()


def serial_equivalent_check(per_rank_losses: list[torch.Tensor]) -> tuple[float, float, float]:
    """``(serial, global_mean, naive)``: the serial mean loss and the mean over ranks of both per-rank losses.

    Pure arithmetic on lists of per-sample losses, for the notebook and the tests (no communication).
    """
    M = sum(len(t) for t in per_rank_losses)
    k = len(per_rank_losses)
    serial = torch.cat(per_rank_losses).mean().item()
    good = sum(global_mean_loss(t, M, k).item() for t in per_rank_losses) / k
    bad = sum(naive_mean_loss(t).item() for t in per_rank_losses if len(t)) / k
    return serial, good, bad
