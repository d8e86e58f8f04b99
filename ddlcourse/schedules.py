"""Learning-rate rules for large batches.

* linear scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): ``lr = base_lr * global_batch / base_batch``
* square-root scaling (Krizhevsky 2014; Hoffer et al. 2017): ``lr = base_lr * sqrt(global_batch / base_batch)``
* gradual warmup (Goyal et al. 2017): ramp linearly from ``lr / warmup_steps`` to ``lr`` over the first steps.
"""
from __future__ import annotations

import math

import torch


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str = "linear") -> float:
    if global_batch < 1 or base_batch < 1:
        raise ValueError(f"batch sizes must be >= 1, got global_batch={global_batch}, base_batch={base_batch}")
    k = global_batch / base_batch
    if rule == "linear":
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    if rule == "none":
        return base_lr
    raise ValueError(f"unknown scaling rule {rule!r}; use 'linear', 'sqrt' or 'none'")


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Multiplier of the target lr at ``step`` (0-based): (step+1)/warmup_steps during warmup, then 1."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def with_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int,
                total_steps: int | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then constant (or cosine decay to 0 when ``total_steps`` is given). Call ``.step()`` per step."""
    def factor(step: int) -> float:
        w = warmup_factor(step, warmup_steps)
        if total_steps is None or step < warmup_steps:
            return w
        t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * t))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
