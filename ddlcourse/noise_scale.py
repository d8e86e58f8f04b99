"""Batch size, measured (notebook 02): gradient noise scale, gradient accumulation, and a batch-size sweep.

Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training")
------------------------------------------------------------------------------------------
A mini-batch gradient ``G_B`` of ``B`` samples drawn independently is the true gradient ``G`` plus noise of
covariance ``Sigma / B`` (``Sigma``: the covariance of one sample's gradient). Hence

    E |G_B|^2 = |G|^2 + tr(Sigma) / B

Measuring ``|G_B|^2`` at two batch sizes ``b_small < b_big`` gives two equations for the two unknowns (their
Appendix A.1):

    |G|^2     ~ (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

and the *simple noise scale* ``B_simple = tr(Sigma) / |G|^2``, their estimate of the critical batch size:
below it, doubling the batch nearly halves the steps needed; well above it, it barely helps.
Both estimators are unbiased; their ratio is not, so we average numerator and denominator over many draws
before dividing, as the paper does.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from ddlcourse.optim import warmup_factor


# --------------------------------------------------------------------------- gradients
def flat_grad(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn=F.cross_entropy) -> torch.Tensor:
    """Gradient of the mean loss on ``(X, y)`` as one flat vector (n_params,)."""
    model.zero_grad(set_to_none=True)
    loss_fn(model(X), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).detach().clone()


def per_example_grads(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn=F.cross_entropy) -> torch.Tensor:
    """One gradient per sample, shape (n, n_params), with ``torch.func`` (vmap over ``grad``)."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p, xi, yi):
        return loss_fn(functional_call(model, p, (xi[None],)), yi[None])

    g = vmap(grad(one), in_dims=(None, 0, 0))(params, X, y)
    return torch.cat([g[k].reshape(len(X), -1) for k in params], dim=1)


def exact_noise_scale(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn=F.cross_entropy) -> dict:
    """``|G|^2``, ``tr(Sigma)`` and ``B_simple`` of the data set ``(X, y)`` itself, from per-example gradients."""
    g = per_example_grads(model, X, y, loss_fn).double()     # (n, n_params)
    G = g.mean(0)
    tr_sigma = ((g - G) ** 2).sum(1).mean().item()          # population covariance trace
    G2 = (G ** 2).sum().item()
    return dict(G2=G2, tr_sigma=tr_sigma, B_simple=tr_sigma / G2)


def estimate_noise_scale(model: nn.Module, X: torch.Tensor, y: torch.Tensor, b_small: int, b_big: int,
                         reps: int = 16, seed: int = 0, loss_fn=F.cross_entropy) -> dict:
    """``B_simple`` from gradient norms at two batch sizes (McCandlish et al. 2018, App. A.1).

    Batches are drawn with replacement, so the samples of one batch are independent, as the formula assumes.
    In data-parallel training ``b_small`` is one rank's batch and ``b_big`` the global batch: both gradients
    exist anyway, so the estimate is almost free.
    """
    if not 1 <= b_small < b_big:
        raise ValueError(f"need 1 <= b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g = torch.Generator().manual_seed(seed)
    n = len(X)
    small, big = [], []
    for _ in range(reps):
        for b, out in ((b_small, small), (b_big, big)):
            idx = torch.randint(0, n, (b,), generator=g)
            out.append(flat_grad(model, X[idx], y[idx], loss_fn).double().pow(2).sum().item())
    s2, b2 = float(np.mean(small)), float(np.mean(big))
    G2 = (b_big * b2 - b_small * s2) / (b_big - b_small)
    tr_sigma = (s2 - b2) / (1.0 / b_small - 1.0 / b_big)
    return dict(G2=G2, tr_sigma=tr_sigma, B_simple=tr_sigma / G2 if G2 > 0 else float("inf"),
                G2_small=s2, G2_big=b2)


# --------------------------------------------------------------------------- gradient accumulation
def accumulate_gradients(model: nn.Module, X: torch.Tensor, y: torch.Tensor, micro_batch: int,
                         loss_fn=F.cross_entropy) -> float:
    """Fill ``.grad`` with the gradient of the mean loss over all of ``(X, y)``, computed ``micro_batch`` at a time.

    Each micro-batch's *summed* loss is divided by the whole batch size (not by its own size), so the
    accumulated gradient equals the big batch's, even when the last micro-batch is smaller. Returns the loss.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    model.zero_grad(set_to_none=True)
    total, n = 0.0, len(X)
    for start in range(0, n, micro_batch):
        xb, yb = X[start:start + micro_batch], y[start:start + micro_batch]   # (<= micro_batch, ...)
        loss = loss_fn(model(xb), yb, reduction="sum") / n
        loss.backward()                                    # gradients add up in .grad
        total += loss.item()
    return total


def max_param_difference(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


# --------------------------------------------------------------------------- batch-size sweep
def train_curve(make_model, X, y, Xte, yte, batch_size: int, lr: float, steps: int, eval_every: int,
                seed: int = 0, momentum: float = 0.9, warmup_steps: int = 0) -> dict:
    """SGD for ``steps`` steps of ``batch_size``; test (and train) loss every ``eval_every`` steps.

    Batches walk through a fresh permutation each epoch. Stops early, marked ``diverged``, when the loss
    becomes non-finite or exceeds 10x its start.
    """
    torch.manual_seed(seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    g = torch.Generator().manual_seed(seed)
    n = len(X)
    order, pos = torch.randperm(n, generator=g), 0
    rec = dict(batch_size=batch_size, lr=lr, steps=[], test_loss=[], train_loss=[], diverged=False)

    def evaluate(step):
        with torch.no_grad():
            rec["steps"].append(step)
            rec["test_loss"].append(F.cross_entropy(model(Xte), yte).item())
            sub = slice(0, min(len(X), len(Xte)))             # a train subset as large as the test set: cheap
            rec["train_loss"].append(F.cross_entropy(model(X[sub]), y[sub]).item())

    evaluate(0)
    start_loss = rec["test_loss"][0]
    for step in range(1, steps + 1):
        if pos + batch_size > n:                          # new epoch: new order
            order, pos = torch.randperm(n, generator=g), 0
        idx = order[pos:pos + batch_size]
        pos += batch_size
        for gr in opt.param_groups:
            gr["lr"] = lr * warmup_factor(step - 1, warmup_steps)
        loss = F.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % eval_every == 0 or step == steps:
            evaluate(step)
            if not math.isfinite(rec["test_loss"][-1]) or rec["test_loss"][-1] > 10 * start_loss:
                rec["diverged"] = True
                break
    rec["model"] = model
    return rec


def accuracy(model: nn.Module, X, y) -> float:
    with torch.no_grad():
        return (model(X).argmax(1) == y).double().mean().item()


def steps_to_target(rec: dict, target: float) -> float:
    """First evaluated step whose test loss is at or below ``target`` (inf if never)."""
    for s, l in zip(rec["steps"], rec["test_loss"]):
        if l <= target:
            return s
    return math.inf


def best_per_batch(records: list[dict]) -> dict:
    """``batch_size -> record`` with the lowest final test loss among the runs that did not diverge."""
    best = {}
    for r in records:
        if r["diverged"]:
            continue
        b = r["batch_size"]
        if b not in best or r["test_loss"][-1] < best[b]["test_loss"][-1]:
            best[b] = r
    return dict(sorted(best.items()))


# --------------------------------------------------------------------------- plots
def plot_sweep(records: list[dict], ax=None):
    """Final test loss over (batch size, lr); an x where training diverged."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.2))
    for b in sorted({r["batch_size"] for r in records}):
        rs = sorted((r for r in records if r["batch_size"] == b), key=lambda r: r["lr"])
        lrs = [r["lr"] for r in rs]
        fin = [np.nan if r["diverged"] else r["test_loss"][-1] for r in rs]
        line, = ax.semilogx(lrs, fin, "o-", ms=4, label=f"B={b}")
        div = [r["lr"] for r in rs if r["diverged"]]
        if div:
            top = np.nanmax([v for v in fin if v == v] or [2.0])
            ax.plot(div, [top * 1.05] * len(div), "x", color=line.get_color(), ms=8)
    ax.set(xlabel="learning rate", ylabel="final test loss", title="x = diverged")
    ax.legend(fontsize=7)
    return ax


def plot_curves(best: dict, axes=None):
    """Test loss against steps and against samples seen, best lr per batch size."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(8.4, 3.0), sharey=True)
    for b, r in best.items():
        s = np.asarray(r["steps"])
        axes[0].plot(s, r["test_loss"], label=f"B={b}, lr={r['lr']:g}")
        axes[1].plot(s * b, r["test_loss"], label=f"B={b}")
    axes[0].set(xlabel="steps", ylabel="test loss")
    axes[1].set(xlabel="samples seen", xscale="log")
    axes[0].legend(fontsize=7)
    return axes
