"""The global-mean loss: averaging per-rank gradients gives the serial gradient, even with uneven shares."""
import pytest
import torch

from ddlcourse import losses as L


def _grads(model, X, y, loss_of):
    model.zero_grad()
    loss_of(torch.nn.functional.cross_entropy(model(X), y, reduction="none")).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()


@pytest.mark.parametrize("sizes", [[8, 8, 8, 8], [3, 3, 2, 2], [5, 1], [2, 1, 0]])
def test_averaged_gradients_equal_serial(sizes):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).double()
    X, y = torch.randn(sum(sizes), 6, dtype=torch.float64), torch.randint(0, 3, (sum(sizes),))
    serial = _grads(model, X, y, lambda l: l.mean())
    k, M = len(sizes), sum(sizes)
    parts = torch.split(torch.arange(M), sizes)
    good = sum(_grads(model, X[p], y[p], lambda l: L.global_mean_loss(l, M, k)) for p in parts) / k
    assert torch.allclose(good, serial, atol=1e-12)
    if len(set(sizes)) > 1 and 0 not in sizes:   # the shortcut is wrong exactly when shares differ
        naive = sum(_grads(model, X[p], y[p], L.naive_mean_loss) for p in parts) / k
        assert not torch.allclose(naive, serial, atol=1e-6)


def test_loss_values():
    per_rank = [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([4.0])]
    serial, good, bad = L.serial_equivalent_check(per_rank)
    assert serial == pytest.approx(7 / 4) and good == pytest.approx(7 / 4)
    assert bad == pytest.approx((1.0 + 4.0) / 2)


def test_bad_input():
    with pytest.raises(ValueError, match="global_count"):
        L.global_mean_loss(torch.ones(3), 0, 2)
    with pytest.raises(ValueError, match="one loss per sample"):
        L.global_mean_loss(torch.ones(3, 2), 6, 2)
    assert L.global_count(5) == 5   # no process group: the local count
