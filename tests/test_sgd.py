"""Notebooks 01 and 02 helpers: numpy gradient descent (known answers), the noise scale, gradient accumulation."""
import numpy as np
import pytest
import torch

from ddlcourse import noise_scale as N
from ddlcourse import sgd


@pytest.fixture
def line():
    return sgd.make_line_data(50, seed=3)


def test_gradient_matches_finite_differences(line):
    x, y = line
    theta = np.array([0.3, -0.7])
    eps = 1e-6
    fd = [(sgd.loss(theta + eps * e, x, y) - sgd.loss(theta - eps * e, x, y)) / (2 * eps) for e in np.eye(2)]
    assert np.allclose(sgd.grad(theta, x, y), fd, atol=1e-6)


def test_optimum_has_zero_gradient(line):
    x, y = line
    assert np.allclose(sgd.grad(sgd.optimum(x, y), x, y), 0, atol=1e-10)


def test_stable_learning_rate_threshold(line):
    x, y = line
    lr_max = sgd.max_stable_lr(x)
    opt = sgd.optimum(x, y)
    good = sgd.gradient_descent(x, y, [0.0, 0.0], 0.9 * lr_max, epochs=400)
    bad = sgd.gradient_descent(x, y, [0.0, 0.0], 1.1 * lr_max, epochs=400)
    assert np.allclose(good[-1], opt, atol=1e-4)
    assert not np.all(np.isfinite(bad[-1])) or np.abs(bad[-1] - opt).max() > 1e3


def test_path_lengths_follow_batch_size(line):
    x, y = line
    assert len(sgd.gradient_descent(x, y, [0, 0], 0.01, epochs=3)) == 3 + 1              # full batch
    assert len(sgd.gradient_descent(x, y, [0, 0], 0.01, epochs=3, batch_size=1)) == 150 + 1
    assert len(sgd.gradient_descent(x, y, [0, 0], 0.01, epochs=2, batch_size=8)) == 2 * 7 + 1
    assert sgd.iterations_per_epoch(1000, 32) == 32 and sgd.iterations_per_epoch(1000, 32, drop_last=True) == 31
    with pytest.raises(ValueError):
        sgd.gradient_descent(x, y, [0, 0], 0.01, epochs=1, batch_size=0)


def _regression():
    torch.manual_seed(0)
    X = torch.randn(2000, 5, dtype=torch.float64)
    y = X @ torch.arange(1.0, 6.0, dtype=torch.float64) + 0.5 * torch.randn(2000, dtype=torch.float64)
    model = torch.nn.Linear(5, 1).double()
    loss = lambda out, t, reduction="mean": torch.nn.functional.mse_loss(out.squeeze(-1), t, reduction=reduction)
    return model, X, y, loss


def test_noise_scale_estimate_close_to_exact():
    model, X, y, loss = _regression()
    exact = N.exact_noise_scale(model, X, y, loss)
    est = N.estimate_noise_scale(model, X, y, 8, 512, reps=400, seed=0, loss_fn=loss)
    assert exact["B_simple"] > 0
    assert est["B_simple"] == pytest.approx(exact["B_simple"], rel=0.3)
    assert est["G2"] == pytest.approx(exact["G2"], rel=0.3)


def test_gradient_accumulation_equals_large_batch():
    model, X, y, loss = _regression()
    Xb, yb = X[:100], y[:100]
    big = N.flat_grad(model, Xb, yb, loss)
    N.accumulate_gradients(model, Xb, yb, micro_batch=16, loss_fn=loss)   # 6 x 16 + 4: uneven last micro-batch
    acc = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(acc, big, atol=1e-12)


def test_heavy_ball_momentum_raises_the_stability_limit():
    x, y = sgd.make_line_data(64, seed=0)
    lr1 = sgd.max_stable_lr(x)
    assert sgd.max_stable_lr(x, momentum=0.9) == pytest.approx(1.9 * lr1)
    start = sgd.optimum(x, y) + np.array([-2.5, 2.0])
    l0 = sgd.loss(start, x, y)
    run = lambda f, mu: sgd.loss(sgd.gradient_descent(x, y, start, f * lr1, epochs=300, momentum=mu)[-1], x, y)  # noqa: E731
    assert run(1.5, 0.0) > l0                                    # plain GD diverges at 1.5x its limit
    assert run(1.5, 0.9) < 1e-3 * l0 + sgd.loss(sgd.optimum(x, y), x, y)   # heavy ball converges there
    assert run(1.05 * 1.9, 0.9) > l0                             # and diverges just above 2(1+mu)/lambda_max
    with pytest.raises(ValueError):
        sgd.max_stable_lr(x, momentum=1.0)


def test_sgd_epoch_keeps_the_last_batch_and_follows_order():
    x, y = sgd.make_line_data(10, seed=1)
    order = np.arange(10)[::-1]
    path = sgd.sgd_epoch([0.0, 0.0], x, y, 0.1, 4, order)
    assert path.shape == (1 + 3, 2)                              # ceil(10 / 4) = 3 iterations
    theta = np.zeros(2)
    for b in ([9, 8, 7, 6], [5, 4, 3, 2], [1, 0]):
        theta = theta - 0.1 * sgd.grad(theta, x[b], y[b])
    assert np.allclose(path[-1], theta)
