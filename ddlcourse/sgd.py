"""Gradient descent you can watch: a 2-parameter linear regression in NumPy (notebook 01).

The model is ``y_hat = w * x + b`` with parameters ``theta = (w, b)`` and the mean-squared-error loss

    L(theta) = mean_i (w * x_i + b - y_i)^2

Two parameters means the whole loss surface fits on one contour plot, and the path of every
optimizer can be drawn on it. The loss is quadratic, so its Hessian ``H = 2/n * A^T A`` (with
``A = [x, 1]``) is constant: plain gradient descent converges exactly when ``lr < 2 / lambda_max(H)``.
"""
from __future__ import annotations

import math

import numpy as np


def make_line_data(n: int, w: float = 2.0, b: float = -1.0, noise: float = 0.5, seed: int = 0):
    """``(x, y)``, each of shape (n,): points around the line ``y = w x + b``, x ~ N(1, 1) (off-centre on purpose:
    it correlates w and b, so the contours are tilted ellipses and the path is not trivial)."""
    if n < 2:
        raise ValueError(f"need at least 2 points to fit a line, got n={n}")
    g = np.random.default_rng(seed)
    x = g.normal(1.0, 1.0, n)
    y = w * x + b + noise * g.standard_normal(n)
    return x, y


def design(x: np.ndarray) -> np.ndarray:
    """``A = [x, 1]``, shape (n, 2), so that ``y_hat = A @ theta``."""
    return np.stack([x, np.ones_like(x)], axis=1)


def loss(theta, x, y) -> float:
    """Mean-squared error of ``theta = (w, b)`` on ``(x, y)``."""
    r = design(x) @ np.asarray(theta, float) - y
    return float(np.mean(r ** 2))


def grad(theta, x, y) -> np.ndarray:
    """Gradient of :func:`loss` with respect to ``(w, b)``: ``2/n A^T (A theta - y)``, shape (2,)."""
    A = design(x)
    r = A @ np.asarray(theta, float) - y
    return 2.0 * A.T @ r / len(y)


def optimum(x, y) -> np.ndarray:
    """The least-squares solution (where the gradient is zero)."""
    return np.linalg.lstsq(design(x), y, rcond=None)[0]


def hessian(x) -> np.ndarray:
    """The constant Hessian ``2/n A^T A`` (2, 2) of the MSE loss."""
    A = design(x)
    return 2.0 * A.T @ A / len(x)


def max_stable_lr(x, momentum: float = 0.0) -> float:
    """Full-batch gradient descent converges for ``lr < 2 / lambda_max`` and diverges above it.

    With heavy-ball momentum ``mu`` (PyTorch's ``SGD(momentum=mu)``: ``v = mu v + g``, ``theta -= lr v``) the
    limit on a quadratic is ``lr < 2 (1 + mu) / lambda_max``: momentum *raises* it (Polyak 1964).
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    return 2.0 * (1.0 + momentum) / float(np.linalg.eigvalsh(hessian(x)).max())


def iterations_per_epoch(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Updates in one pass over ``n`` samples in batches of ``batch_size``."""
    if batch_size < 1 or n < 1:
        raise ValueError(f"need n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def sgd_epoch(theta, x, y, lr: float, batch_size: int, order, momentum: float = 0.0, velocity=None):
    """One epoch of mini-batch SGD over the samples in ``order``; returns the path, shape (iterations + 1, 2).

    Batch ``k`` is ``order[k*B:(k+1)*B]``; the last, smaller batch is kept, so an epoch is ``ceil(n / B)``
    iterations. Each step follows the gradient of the batch's *mean* loss. With ``momentum`` (heavy ball, as
    PyTorch's SGD) pass a ``velocity`` array to carry it from one epoch to the next (it is updated in place).
    """
    B = int(batch_size)
    if B < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = np.asarray(order)
    theta = np.asarray(theta, float).copy()
    v = np.zeros_like(theta) if velocity is None else velocity
    path = [theta.copy()]
    for start in range(0, len(order), B):
        idx = order[start:start + B]                      # this iteration's batch
        v[...] = momentum * v + grad(theta, x[idx], y[idx])
        theta = theta - lr * v
        path.append(theta.copy())
        if not np.all(np.isfinite(theta)) or np.abs(theta).max() > 1e6:
            break                                         # diverged: stop early
    return np.array(path)


def gradient_descent(x, y, theta0, lr: float, epochs: int, batch_size: int | None = None, seed: int = 0,
                     momentum: float = 0.0):
    """Mini-batch SGD; returns the path, shape (iterations + 1, 2), starting at ``theta0``.

    ``batch_size=None`` (or ``>= n``) is full-batch gradient descent, ``1`` is "pure" stochastic gradient
    descent, anything between is mini-batch SGD. Each epoch visits every point once in a new random order
    (:func:`sgd_epoch`). ``momentum`` adds heavy-ball momentum, as PyTorch's ``SGD(momentum=...)``.
    """
    n = len(y)
    B = n if batch_size is None else int(batch_size)
    if B < 1:
        raise ValueError(f"batch_size must be >= 1 or None (full batch), got {batch_size}")
    g = np.random.default_rng(seed)
    theta = np.asarray(theta0, float).copy()
    velocity = np.zeros_like(theta)
    path = [theta.copy()]
    for _ in range(epochs):
        order = g.permutation(n) if B < n else np.arange(n)
        ep = sgd_epoch(theta, x, y, lr, B, order, momentum, velocity)
        path.extend(ep[1:])
        theta = ep[-1]
        if not np.all(np.isfinite(theta)) or np.abs(theta).max() > 1e6:
            break                                         # diverged: stop early
    return np.array(path)


def loss_grid(x, y, w_range, b_range, n: int = 80):
    """``(W, B, L)``: the loss on an ``n x n`` grid of (w, b) for a contour plot."""
    ws = np.linspace(*w_range, n)
    bs = np.linspace(*b_range, n)
    W, Bg = np.meshgrid(ws, bs)                           # (n, n) each
    preds = W[..., None] * x + Bg[..., None]              # (n, n, points)
    L = np.mean((preds - y) ** 2, axis=-1)
    return W, Bg, L


def plot_paths(x, y, paths: dict, ax=None, span: float = 3.0, grid: int = 80, title: str | None = None):
    """Loss contours around the optimum with each ``name -> path`` drawn on top."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    opt = optimum(x, y)
    W, Bg, L = loss_grid(x, y, (opt[0] - span, opt[0] + span), (opt[1] - span, opt[1] + span), grid)
    ax.contour(W, Bg, L, levels=np.quantile(L, np.linspace(0.01, 0.9, 14)), cmap="Greys", linewidths=0.8)
    for name, p in paths.items():
        ax.plot(p[:, 0], p[:, 1], ".-", ms=3, lw=1, label=f"{name} ({len(p) - 1} it.)")
    ax.plot(*opt, "k*", ms=10)
    ax.set(xlim=(opt[0] - span, opt[0] + span), ylim=(opt[1] - span, opt[1] + span), xlabel="w", ylabel="b")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    return ax


def plot_loss_curves(x, y, paths: dict, ax=None, title: str | None = None):
    """Loss (log scale) against iteration for each ``name -> path``."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.2))
    for name, p in paths.items():
        ax.semilogy([loss(t, x, y) for t in p], label=name)
    ax.set(xlabel="iteration", ylabel="loss (MSE)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return ax
