"""The coding exercises of notebook 01 (the MSE gradient, one epoch of mini-batch SGD)."""
import numpy as np

from ddlcourse import sgd
from ddlcourse.exercises.solutions import sgd as ex
from ddlcourse.selfcheck import run_checker


def test_mse_grad_accepts_reference_and_hand_written():
    assert run_checker("mse_grad", sgd.grad).ok

    def mine(theta, x, y):
        r = theta[0] * x + theta[1] - y
        return np.array([2 * np.mean(r * x), 2 * np.mean(r)])
    assert run_checker("mse_grad", mine).ok


def test_mse_grad_names_mistakes():
    for wrong, hint in [(ex._grad_no_two, "factor 2"), (ex._grad_summed, "SUM"), (ex._grad_sign, "sign"),
                        (ex._grad_w_only_x, "no factor x")]:
        v = run_checker("mse_grad", wrong)
        assert not v.ok and hint in v.message, (wrong.__name__, v.message)


def test_sgd_epoch_accepts_reference_and_hand_written():
    assert run_checker("sgd_epoch", sgd.sgd_epoch).ok

    def mine(theta, x, y, lr, batch_size, order):
        path = [np.array(theta, float)]
        for k in range(int(np.ceil(len(order) / batch_size))):
            b = order[k * batch_size:(k + 1) * batch_size]
            path.append(path[-1] - lr * sgd.grad(path[-1], x[b], y[b]))
        return np.array(path)
    assert run_checker("sgd_epoch", mine).ok


def test_sgd_epoch_names_mistakes():
    for wrong, hint in [(ex._epoch_floor, "last, smaller batch is missing"), (ex._epoch_no_start, "starting point"),
                        (ex._epoch_ignores_order, "follow `order`"), (ex._epoch_full_gradient, "batch only"),
                        (ex._epoch_summed, "SUM")]:
        v = run_checker("sgd_epoch", wrong)
        assert not v.ok and hint in v.message, (wrong.__name__, v.message)
