"""Exercises of notebooks/07_large_batch.ipynb."""
import math

from ddlcourse.selfcheck import exercise


@exercise("steps_per_epoch", "one step consumes one global batch")
def steps_per_epoch(n_train: int, global_batch: int) -> int:
    return n_train // global_batch


@exercise("sqrt_scaled_lr", "square-root scaling: lr grows with the square root of the batch ratio")
def sqrt_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    return base_lr * math.sqrt(global_batch / base_batch)
