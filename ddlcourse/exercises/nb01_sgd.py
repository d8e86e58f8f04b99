"""Exercises of notebooks/01_sgd.ipynb."""
import numpy as np

from ddlcourse import sgd
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("iterations_per_epoch", "one iteration per batch; the last, smaller batch still counts: ceil(n / batch_size)")
def iterations_per_epoch(n: int, batch_size: int) -> int:
    return sgd.iterations_per_epoch(n, batch_size)


@exercise("max_stable_lr", "gradient descent on a quadratic diverges when lr > 2 / (largest eigenvalue of the Hessian)")
def max_stable_lr(n: int, seed: int) -> float:
    x, _ = sgd.make_line_data(n, seed=seed)
    return sgd.max_stable_lr(x)


# --------------------------------------------------------------------------- coding exercises
def _grad_no_two(theta, x, y):                # forgot the factor 2 of the square
    return sgd.grad(theta, x, y) / 2


def _grad_summed(theta, x, y):                # gradient of the summed, not the mean, loss
    return sgd.grad(theta, x, y) * len(y)


def _grad_sign(theta, x, y):                  # residual y - prediction: the ascent direction
    return -sgd.grad(theta, x, y)


def _grad_w_only_x(theta, x, y):              # d/db computed like d/dw (multiplied by x)
    r = theta[0] * x + theta[1] - y
    return np.array([2 * np.mean(r * x), 2 * np.mean(r * x)])


def _mse_grad_solution(theta, x, y):
    """The gradient of L = mean((w x + b - y)^2), as a learner writes it."""
    w, b = theta
    r = w * x + b - y                                   # the residual, prediction - y
    return np.array([2 * np.mean(r * x), 2 * np.mean(r)])


@code_exercise("mse_grad", solution=_mse_grad_solution, mistakes=[
    (_grad_no_two, "the factor 2"), (_grad_summed, "SUM of squared errors"), (_grad_sign, "the sign is flipped"),
    (_grad_w_only_x, "no factor x")])
def check_mse_grad(fn) -> Verdict:
    """``fn(theta, x, y)`` -> the gradient (dL/dw, dL/db) of the mean-squared error, shape (2,)."""
    x, y = sgd.make_line_data(13, seed=3)
    cases = [np.array([0.5, 0.5]), np.array([-1.0, 2.0]), np.array([3.0, -0.5])]
    got = [np.asarray(fn(t.copy(), x.copy(), y.copy()), dtype=float) for t in cases]
    ref = [sgd.grad(t, x, y) for t in cases]
    wrong = lambda f: [f(t, x, y) for t in cases]  # noqa: E731
    return diagnose(got, ref, {
        "the factor 2 from differentiating the square is missing": wrong(_grad_no_two),
        "that is the gradient of the SUM of squared errors: divide by n for the mean": wrong(_grad_summed),
        "the sign is flipped: use the residual (prediction - y), the gradient points uphill": wrong(_grad_sign),
        "dL/db has no factor x: the bias enters the prediction as b * 1": wrong(_grad_w_only_x),
    }, what="the gradient")


def _epoch_floor(theta, x, y, lr, batch_size, order):      # drops the last, smaller batch
    keep = (len(order) // batch_size) * batch_size
    return sgd.sgd_epoch(theta, x, y, lr, batch_size, order[:keep])


def _epoch_ignores_order(theta, x, y, lr, batch_size, order):
    return sgd.sgd_epoch(theta, x, y, lr, batch_size, np.arange(len(order)))


def _epoch_full_gradient(theta, x, y, lr, batch_size, order):  # every step on all the data
    path = [np.asarray(theta, float)]
    for _ in range(-(-len(order) // batch_size)):
        path.append(path[-1] - lr * sgd.grad(path[-1], x, y))
    return np.array(path)


def _epoch_summed(theta, x, y, lr, batch_size, order):     # gradient of the batch's summed loss
    path = [np.asarray(theta, float)]
    for s in range(0, len(order), batch_size):
        b = order[s:s + batch_size]
        path.append(path[-1] - lr * len(b) * sgd.grad(path[-1], x[b], y[b]))
    return np.array(path)


def _epoch_no_start(theta, x, y, lr, batch_size, order):   # the path without its starting point
    return sgd.sgd_epoch(theta, x, y, lr, batch_size, order)[1:]


def _sgd_epoch_solution(theta, x, y, lr, batch_size, order):
    """One epoch of mini-batch SGD in the given order, as a learner writes it."""
    path = [np.array(theta, float)]
    for start in range(0, len(order), batch_size):      # the last, smaller batch is kept
        b = order[start:start + batch_size]
        w, c = path[-1]
        r = w * x[b] + c - y[b]
        g = np.array([2 * np.mean(r * x[b]), 2 * np.mean(r)])
        path.append(path[-1] - lr * g)
    return np.array(path)


@code_exercise("sgd_epoch", solution=_sgd_epoch_solution, mistakes=[
    (_epoch_floor, "the last, smaller batch is missing"), (_epoch_ignores_order, "you did not follow `order`"),
    (_epoch_full_gradient, "the gradient of its batch only"), (_epoch_summed, "the batch's SUM"),
    (_epoch_no_start, "the starting point included")])
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
    return diagnose(got, ref, {
        "batch k must be order[k*B:(k+1)*B]: you did not follow `order`": _epoch_ignores_order(theta0, x, y, lr, B, order),
        "each step must use the gradient of its batch only, not of all the data": _epoch_full_gradient(theta0, x, y, lr, B, order),
        "you stepped along the gradient of the batch's SUM: use the mean (sgd.grad does)": _epoch_summed(theta0, x, y, lr, B, order),
    }, what="the path")
