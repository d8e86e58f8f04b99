"""Token sequences with something to learn, for the small transformer: the *sort* task.

A sequence is ``n`` random symbols, a separator, then the same symbols sorted::

    3 1 4 1 5 9 2 6 | 1 1 2 3 4 5 6 9

The model reads ``seq[:-1]`` and predicts ``seq[1:]``. The first half is random, so its targets are
ignored (-100); the sorted half is fully determined by the prompt, so a model that has learnt to sort
drives the loss towards 0, while a model that ignores the prompt stays near ``log(n_symbols)`` (or a bit
lower: sorted output is not uniform). Attention has to look back across the whole sequence to solve it.

Like :mod:`ddlcourse.data.toy`, sample ``i`` depends only on ``(seed, i)``: any shard of ranks sees the
same global data set (:func:`sort_batch` with ``start``).
"""
from __future__ import annotations

import math

import numpy as np
import torch


def sort_task_vocab(n_symbols: int) -> int:
    """Vocabulary size: the symbols plus the separator (the last id)."""
    return n_symbols + 1


def sort_batch(n: int, n_symbols: int = 10, length: int = 8, seed: int = 0, start: int = 0,
               device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``start .. start+n-1`` of the sort task: ``(inputs, targets)``, both (n, 2*length) int64.

    ``inputs`` = symbols, separator, sorted symbols minus the last; ``targets`` = inputs shifted by one,
    with -100 (ignored by the loss) where the target is still part of the random prompt.
    """
    if n < 1 or length < 1 or n_symbols < 2 or start < 0:
        raise ValueError(f"need n >= 1, length >= 1, n_symbols >= 2, start >= 0; got n={n}, length={length}, "
                         f"n_symbols={n_symbols}, start={start}")
    rows = []
    for i in range(start, start + n):
        g = np.random.default_rng([seed, i])                             # sample i depends on (seed, i) only
        a = g.integers(0, n_symbols, length)
        rows.append(np.concatenate([a, [n_symbols], np.sort(a)]))
    seq = torch.from_numpy(np.stack(rows).astype(np.int64))            # (n, 2*length+1)
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    y[:, :length - 1] = -100                                            # predicting random symbols: not learnable
    y[:, length - 1] = -100                                             # ... nor the separator's position
    return x.to(device or "cpu"), y.to(device or "cpu")


def chance_loss(n_symbols: int) -> float:
    """Loss of a model that predicts each sorted symbol uniformly at random: ``log(n_symbols)``."""
    return math.log(n_symbols)


def sorted_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Share of the sorted symbols predicted exactly (positions with target -100 left out)."""
    mask = targets != -100
    return float((logits.argmax(-1)[mask] == targets[mask]).float().mean())
