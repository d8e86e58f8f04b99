"""Checkers of notebooks/01_sgd.ipynb: its questions, the MSE gradient and one epoch of mini-batch SGD, both checked
against the package's own (:mod:`ddlcourse.sgd`)."""
import numpy as np

from ddlcourse import sgd
from ddlcourse.exercises.solutions.sgd import EPOCH_VARIANTS, GRAD_VARIANTS
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("iterations_per_epoch", "one iteration per batch; the last, smaller batch still counts: ceil(n / batch_size)")
def iterations_per_epoch(n: int, batch_size: int) -> int:
    return sgd.iterations_per_epoch(n, batch_size)


@exercise("max_stable_lr", "gradient descent on a quadratic diverges when lr > 2 / (largest eigenvalue of the Hessian)")
def max_stable_lr(n: int, seed: int) -> float:
    x, _ = sgd.make_line_data(n, seed=seed)
    return sgd.max_stable_lr(x)


# --------------------------------------------------------------------------- coding exercises
GRAD_HINTS = {
    "no_two": "the factor 2 from differentiating the square is missing",
    "summed": "that is the gradient of the SUM of squared errors: divide by n for the mean",
    "sign": "the sign is flipped: use the residual (prediction - y), the gradient points uphill",
    "w_only_x": "dL/db has no factor x: the bias enters the prediction as b * 1",
}


@code_exercise("mse_grad")
def check_mse_grad(fn) -> Verdict:
    """``fn(theta, x, y)`` -> the gradient (dL/dw, dL/db) of the mean-squared error, shape (2,)."""
    x, y = sgd.make_line_data(13, seed=3)
    cases = [np.array([0.5, 0.5]), np.array([-1.0, 2.0]), np.array([3.0, -0.5])]
    got = [np.asarray(fn(t.copy(), x.copy(), y.copy()), dtype=float) for t in cases]
    ref = [sgd.grad(t, x, y) for t in cases]
    wrong = lambda f: [f(t, x, y) for t in cases]  # noqa: E731
    return diagnose(got, ref, {hint: wrong(GRAD_VARIANTS[kind]) for kind, hint in GRAD_HINTS.items()},
                    what="the gradient")


# The path's length already names a dropped last batch and a path without its start; these three keep the length.
EPOCH_HINTS = {
    "ignores_order": "batch k must be order[k*B:(k+1)*B]: you did not follow `order`",
    "full_gradient": "each step must use the gradient of its batch only, not of all the data",
    "summed": "you stepped along the gradient of the batch's SUM: use the mean (sgd.grad does)",
}


@code_exercise("sgd_epoch")
def check_sgd_epoch(fn) -> Verdict:
    """``fn(theta, x, y, lr, batch_size, order)`` -> the path of one epoch, shape (iterations + 1, 2)."""
    x, y = sgd.make_line_data(30, seed=5)
    order = np.random.default_rng(11).permutation(30)
    theta0, lr, B = np.array([0.0, 0.0]), 0.05, 8              # 30 = 3 x 8 + 6: the last batch is smaller
    got = np.asarray(fn(theta0.copy(), x.copy(), y.copy(), lr, B, order.copy()), dtype=float)
    ref = sgd.sgd_epoch(theta0, x, y, lr, B, order)
    n_it = ref.shape[0] - 1
    if got.shape != ref.shape:
        if got.shape == (n_it, 2) and np.allclose(got, ref[1:]):
            return Verdict(False, "return the whole path, the starting point included: iterations + 1 rows")
        if got.shape == (n_it, 2):      # one iteration short: floor(30 / 8) = 3 instead of ceil = 4
            return Verdict(False, "the last, smaller batch is missing: an epoch is ceil(n / B) iterations, not floor")
        return Verdict(False, f"the path has shape {got.shape}, expected {ref.shape} "
                              f"(ceil({len(order)} / {B}) = {n_it} iterations, plus the start)")
    return diagnose(got, ref, {hint: EPOCH_VARIANTS[kind](theta0, x, y, lr, B, order)
                               for kind, hint in EPOCH_HINTS.items()}, what="the path")
