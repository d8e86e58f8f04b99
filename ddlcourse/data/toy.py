"""Small synthetic tasks for the concept notebooks: quick on a CPU, yet real enough to learn.

* :func:`teacher_classification` -- points labelled by a fixed random "teacher" network, plus label noise.
  A student MLP can learn it, but not perfectly: the loss keeps a noise floor, like real data.
* :func:`shapes` -- tiny grey images of discs, squares and crosses at random positions and sizes, with noise.
  A small CNN (with batch norm) learns it in seconds.

Both are pure functions of ``(n, seed, ...)``; index ``i`` of the full set is the same whatever shard asks
for it, so sharding by rank never changes the global data (see :func:`take`).
"""
from __future__ import annotations

import numpy as np
import torch


def teacher_classification(n: int, dim: int = 16, n_classes: int = 4, seed: int = 0,
                           label_noise: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)``: ``X`` (n, dim) float32 standard normal, ``y`` (n,) int64 from a random 2-layer teacher."""
    if n < 1 or dim < 1 or n_classes < 2:
        raise ValueError(f"need n >= 1, dim >= 1, n_classes >= 2; got n={n}, dim={dim}, n_classes={n_classes}")
    g = np.random.default_rng(seed)
    w1 = g.standard_normal((dim, 32)) / np.sqrt(dim)
    w2 = g.standard_normal((32, n_classes)) / np.sqrt(32)
    X = g.standard_normal((n, dim))
    logits = np.tanh(X @ w1) @ w2
    y = logits.argmax(1)
    flip = g.random(n) < label_noise
    y[flip] = g.integers(0, n_classes, flip.sum())
    return torch.from_numpy(X.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


SHAPE_NAMES = ("disc", "square", "cross")


def shapes(n: int, size: int = 16, seed: int = 0, noise: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)``: ``X`` (n, 1, size, size) float32 images, ``y`` (n,) int64 in {0: disc, 1: square, 2: cross}."""
    if n < 1 or size < 8:
        raise ValueError(f"need n >= 1 and size >= 8, got n={n}, size={size}")
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    X = np.empty((n, 1, size, size), np.float32)
    y = g.integers(0, 3, n)
    for i in range(n):
        r = g.uniform(0.18, 0.32) * size
        cy, cx = g.uniform(r, size - r, 2)
        dy, dx = yy - cy, xx - cx
        if y[i] == 0:
            img = (dy**2 + dx**2 <= r**2)
        elif y[i] == 1:
            img = (np.abs(dy) <= 0.8 * r) & (np.abs(dx) <= 0.8 * r)
        else:
            w = 0.3 * r
            img = ((np.abs(dy) <= w) & (np.abs(dx) <= r)) | ((np.abs(dx) <= w) & (np.abs(dy) <= r))
        X[i, 0] = img * g.uniform(0.6, 1.4) + noise * g.standard_normal((size, size))
    return torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))


def take(X: torch.Tensor, y: torch.Tensor, indices) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``indices`` of a data set (e.g. one rank's shard of one global batch)."""
    idx = torch.as_tensor(indices, dtype=torch.long)
    return X[idx], y[idx]
