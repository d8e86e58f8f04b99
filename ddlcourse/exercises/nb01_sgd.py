"""Exercises of notebooks/01_sgd.ipynb."""
from ddlcourse import sgd
from ddlcourse.selfcheck import exercise


@exercise("iterations_per_epoch", "one iteration per batch; the last, smaller batch still counts: ceil(n / batch_size)")
def iterations_per_epoch(n: int, batch_size: int) -> int:
    return sgd.iterations_per_epoch(n, batch_size)


@exercise("max_stable_lr", "gradient descent on a quadratic diverges when lr > 2 / (largest eigenvalue of the Hessian)")
def max_stable_lr(n: int, seed: int) -> float:
    x, _ = sgd.make_line_data(n, seed=seed)
    return sgd.max_stable_lr(x)
