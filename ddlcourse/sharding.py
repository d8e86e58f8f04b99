"""Which samples each rank trains on: a correct sharded sampler, and the padding bug it replaces.

The rule that keeps a distributed run identical to a serial one:

1. every rank draws the **same** permutation of the data set for an epoch (seeded by ``seed`` and ``epoch``);
2. that permutation is cut into **global batches** of ``global_batch`` consecutive samples, exactly as a serial
   run would cut it (the last one may be smaller);
3. each global batch is split among the ranks into disjoint, contiguous shares whose sizes differ by at
   most one. Nothing is padded, repeated or dropped.

With the global-mean loss of :mod:`ddlcourse.losses`, averaging the gradients over the ranks then gives the
serial gradient of every global batch, even when the shares differ in size.

``torch.utils.data.DistributedSampler`` does something else: it gives each rank a fixed share of the whole
epoch and, when the data set does not divide by the number of ranks, **pads** it by repeating the first samples
(or, with ``drop_last=True``, drops the tail). :func:`distributed_sampler_indices` reproduces it (it is
tested against torch's) so notebook 03 can show what that does to the loss.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _check(n: int, world_size: int, rank: int) -> None:
    if n < 1:
        raise ValueError(f"the data set must have at least one sample, got n={n}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")


def epoch_permutation(n: int, epoch: int, seed: int = 0, shuffle: bool = True) -> np.ndarray:
    """The order of the ``n`` samples in ``epoch``; the same on every rank (it depends on seed and epoch only)."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def num_global_batches(n: int, global_batch: int, drop_last: bool = False) -> int:
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    return n // global_batch if drop_last else math.ceil(n / global_batch)


def split_sizes(total: int, world_size: int) -> list[int]:
    """Sizes of the ranks' shares of ``total`` samples: as equal as possible, the first ranks one larger."""
    base, extra = divmod(total, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def shard(batch: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous share of one global batch (may be empty when the batch has < world_size samples)."""
    _check(max(len(batch), 1), world_size, rank)
    sizes = split_sizes(len(batch), world_size)
    start = sum(sizes[:rank])
    return batch[start:start + sizes[rank]]


def global_batches(n: int, global_batch: int, epoch: int, seed: int = 0, shuffle: bool = True,
                   drop_last: bool = False) -> list[np.ndarray]:
    """The serial run's batches for one epoch: ``global_batch`` consecutive samples of the permutation."""
    order = epoch_permutation(n, epoch, seed, shuffle)
    nb = num_global_batches(n, global_batch, drop_last)
    return [order[i * global_batch:(i + 1) * global_batch] for i in range(nb)]


def sharded_batches(n: int, global_batch: int, rank: int, world_size: int, epoch: int, seed: int = 0,
                    shuffle: bool = True, drop_last: bool = False) -> list[np.ndarray]:
    """This rank's share of every global batch of ``epoch``: a list of index arrays, one per step.

    Every rank gets the same number of steps (so the collectives line up); the union of the ranks' shares of
    step ``i`` is exactly the serial run's batch ``i``.
    """
    _check(n, world_size, rank)
    return [shard(b, rank, world_size) for b in global_batches(n, global_batch, epoch, seed, shuffle, drop_last)]


def distributed_sampler_indices(n: int, rank: int, world_size: int, epoch: int = 0, seed: int = 0,
                                shuffle: bool = True, drop_last: bool = False, order=None) -> np.ndarray:
    """Reproduce ``torch.utils.data.DistributedSampler``: this rank's indices for the whole epoch.

    The epoch's order is padded by repeating its first samples up to a multiple of ``world_size``
    (``drop_last=False``), or cut down to one (``drop_last=True``); rank ``r`` then takes every
    ``world_size``-th index starting at ``r``. With ``shuffle=True`` the order is torch's
    ``randperm(n)`` from a generator seeded with ``seed + epoch``, as in torch. Pass ``order`` (the epoch's
    permutation) to pad a given order instead, e.g. :func:`epoch_permutation`'s, so that padding is the only
    difference from :func:`sharded_batches`.
    """
    _check(n, world_size, rank)
    if order is not None:
        order = np.asarray(order)
    elif shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).numpy()
    else:
        order = np.arange(n)
    if drop_last:
        total = (n // world_size) * world_size
        order = order[:total]                                    # the tail is never seen this epoch
    else:
        total = math.ceil(n / world_size) * world_size
        pad = total - n
        order = np.concatenate([order, np.resize(order, pad)])   # repeats the first `pad` samples
    return order[rank:total:world_size]


def padded_sampler_batches(n: int, micro_batch: int, rank: int, world_size: int, epoch: int, seed: int = 0,
                           shuffle: bool = True, drop_last: bool = False, order=None) -> list[np.ndarray]:
    """What a rank trains on with ``DataLoader(ds, batch_size=micro_batch, sampler=DistributedSampler(...))``."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    idx = distributed_sampler_indices(n, rank, world_size, epoch, seed, shuffle, drop_last, order)
    return [idx[i:i + micro_batch] for i in range(0, len(idx), micro_batch)]


def duplicates_and_missing(per_rank: list[np.ndarray], n: int) -> tuple[int, int]:
    """``(duplicated, missing)`` sample counts of one epoch, given every rank's indices."""
    seen = np.bincount(np.concatenate(per_rank).astype(int), minlength=n) if per_rank else np.zeros(n, int)
    return int(np.clip(seen - 1, 0, None).sum()), int((seen == 0).sum())
