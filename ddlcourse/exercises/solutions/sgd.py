"""Reference solutions of notebooks/01_sgd.ipynb: the MSE gradient and one epoch of mini-batch SGD as a learner writes
them, and each with one typical mistake (what its checker, :mod:`ddlcourse.exercises.checkers.sgd`, must name)."""
import numpy as np

from ddlcourse import sgd
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the MSE gradient
def _grad_no_two(theta, x, y):                # forgot the factor 2 of the square
    return sgd.grad(theta, x, y) / 2


def _grad_summed(theta, x, y):                # gradient of the summed, not the mean, loss
    return sgd.grad(theta, x, y) * len(y)


def _grad_sign(theta, x, y):                  # residual y - prediction: the ascent direction
    return -sgd.grad(theta, x, y)


def _grad_w_only_x(theta, x, y):              # d/db computed like d/dw (multiplied by x)
    r = theta[0] * x + theta[1] - y
    return np.array([2 * np.mean(r * x), 2 * np.mean(r * x)])


GRAD_VARIANTS = {"no_two": _grad_no_two, "summed": _grad_summed, "sign": _grad_sign, "w_only_x": _grad_w_only_x}


def _mse_grad_solution(theta, x, y):
    """The gradient of L = mean((w x + b - y)^2), as a learner writes it."""
    w, b = theta
    r = w * x + b - y                                   # the residual, prediction - y
    return np.array([2 * np.mean(r * x), 2 * np.mean(r)])


reference("mse_grad", mistakes=[
    (_grad_no_two, "the factor 2"), (_grad_summed, "SUM of squared errors"), (_grad_sign, "the sign is flipped"),
    (_grad_w_only_x, "no factor x")])(_mse_grad_solution)


# --------------------------------------------------------------------------- one epoch of mini-batch SGD
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


# The ones the checker runs to name them (it tells the other two by the path's shape).
EPOCH_VARIANTS = {"ignores_order": _epoch_ignores_order, "full_gradient": _epoch_full_gradient,
                  "summed": _epoch_summed}


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


reference("sgd_epoch", mistakes=[
    (_epoch_floor, "the last, smaller batch is missing"), (_epoch_ignores_order, "you did not follow `order`"),
    (_epoch_full_gradient, "the gradient of its batch only"), (_epoch_summed, "the batch's SUM"),
    (_epoch_no_start, "the starting point included")])(_sgd_epoch_solution)
