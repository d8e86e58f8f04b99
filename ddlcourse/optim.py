"""The learning-rate rules for large batches, and one factory for the optimizers the course compares as the
global batch grows.

    from ddlcourse.optim import make_optimizer, with_warmup
    opt = make_optimizer("lamb", model.parameters(), lr=0.01)
    sched = with_warmup(opt, warmup_steps=5)          # call sched.step() after every opt.step()
    # or both at once:
    opt, sched = make_optimizer_and_schedule("lars", model.parameters(), lr=1.0, warmup_steps=5)

=========  ==========================================  =========================================
name       class                                       idea
=========  ==========================================  =========================================
sgd        torch.optim.SGD (momentum 0.9 by default)   the baseline
adam       torch.optim.Adam                            per-coordinate step size
lars       pytorch_optimizer.LARS                      layer-wise trust ratio on SGD (You et al. 2017)
lamb       pytorch_optimizer.Lamb                      layer-wise trust ratio on Adam (You et al. 2020)
shampoo    pytorch_optimizer.Shampoo                   per-dimension preconditioner matrices, a
                                                       second-order method (Gupta et al. 2018)
soap       pytorch_optimizer.SOAP                      Adam run in the eigenbasis of Shampoo's
                                                       preconditioners (Vyas et al. 2024)
=========  ==========================================  =========================================

Plain Shampoo sums its statistics over all steps, as Adagrad does, so its steps shrink as training goes
on and its learning rate does not carry over from one batch size to another. Production Shampoo grafts
another optimizer's step size onto Shampoo's direction (Anil et al. 2020); SOAP, the stable variant the
labs use, keeps Adam's moving averages in Shampoo's eigenbasis, so its lr behaves like Adam's.

All of them take ``lr`` and ``weight_decay``; any other keyword goes to the class unchanged.

Consistency across ranks: these optimizers keep their state (momentum, Adam moments, Shampoo's and SOAP's
preconditioners) per rank. With data parallelism every rank sees the same averaged gradient, so the
states stay identical as long as every rank starts from the same state: broadcast it once
(``hvd.broadcast_optimizer_state`` or :func:`broadcast_state`) after loading a checkpoint.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import now, rank_device
from ddlcourse.models.small import MLP

# --------------------------------------------------------------------------- learning-rate rules for large batches
# * linear scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): ``lr = base_lr * global_batch / base_batch``
# * square-root scaling (Krizhevsky 2014; Hoffer et al. 2017): ``lr = base_lr * sqrt(global_batch / base_batch)``
# * gradual warmup (Goyal et al. 2017): ramp linearly from ``lr / warmup_steps`` to ``lr`` over the first steps.

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


# --------------------------------------------------------------------------- the optimizers
OPTIMIZERS = ("sgd", "adam", "lars", "lamb", "shampoo", "soap")

# sensible defaults for the small models of the notebooks; a caller's keyword wins
_DEFAULTS = {
    "sgd": dict(momentum=0.9),
    "adam": dict(),
    "lars": dict(momentum=0.9, trust_coefficient=0.02),  # paper: 0.001 with lr ~10; small nets here
    "lamb": dict(),
    "shampoo": dict(momentum=0.9),
    "soap": dict(precondition_frequency=10),   # re-diagonalise the preconditioners every 10 steps
}

__all__ = ["OPTIMIZERS", "make_optimizer", "make_optimizer_and_schedule", "scaled_lr", "warmup_factor", "with_warmup",
           "broadcast_state", "state_tensors", "lars_trust_ratio", "lamb_trust_ratio"]


def _pytorch_optimizer(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pytorch_optimizer  # lazy: optional, and slow to import
    return {"lars": pytorch_optimizer.LARS, "lamb": pytorch_optimizer.Lamb,
            "shampoo": pytorch_optimizer.Shampoo, "soap": pytorch_optimizer.SOAP}[name]


def make_optimizer(name: str, params, lr: float, weight_decay: float = 0.0, **kw) -> torch.optim.Optimizer:
    """The optimizer called ``name`` (one of :data:`OPTIMIZERS`, case-insensitive) over ``params``."""
    key = str(name).lower()
    if key not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    opts = dict(_DEFAULTS[key], weight_decay=weight_decay, **kw)
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, **opts)
    if key == "adam":
        return torch.optim.Adam(params, lr=lr, **opts)
    return _pytorch_optimizer(key)(params, lr=lr, **opts)


def make_optimizer_and_schedule(name: str, params, lr: float, warmup_steps: int = 0,
                                total_steps: int | None = None, **kw):
    """``(optimizer, scheduler)``: linear warmup over ``warmup_steps``, then constant (or cosine to 0
    when ``total_steps`` is given). Call ``scheduler.step()`` after each ``optimizer.step()``."""
    opt = make_optimizer(name, params, lr, **kw)
    return opt, with_warmup(opt, warmup_steps, total_steps)


def broadcast_state(optimizer: torch.optim.Optimizer, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s optimizer state tensors to every rank (after a checkpoint load, say).

    Every rank must already hold the same *structure* of state (take one step, or load the same
    checkpoint), since only the tensor contents travel.
    """
    with torch.no_grad():
        for t in state_tensors(optimizer):
            if t.numel():
                tdist.broadcast(t, src=src, group=group)


def state_tensors(optimizer: torch.optim.Optimizer):
    """Every tensor of the optimizer's state, also inside lists (SOAP keeps one matrix per dimension)."""
    def walk(v):
        if torch.is_tensor(v):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from walk(x)

    for state in optimizer.state.values():
        for v in state.values():
            yield from walk(v)


# --------------------------------------------------------------------------- the experiments of notebook 12
# base lr at the base batch, and how it grows with the global batch (scaled_lr above)
RECIPES = {
    "sgd": (0.05, "linear"),
    "adam": (0.002, "sqrt"),
    "lars": (0.5, "sqrt"),
    "lamb": (0.005, "sqrt"),
    "shampoo": (0.2, "none"),   # Adagrad-like accumulation: a large lr, not scaled up with the batch
    "soap": (0.01, "sqrt"),
}


def lars_trust_ratio(weight: torch.Tensor, grad: torch.Tensor, eta: float = 0.001,
                     weight_decay: float = 0.0) -> float:
    """LARS's layer-wise trust ratio (You et al. 2017): ``eta * ||w|| / (||g|| + weight_decay * ||w||)``.

    The layer's step is ``lr * ratio * (g + weight_decay * w)``. 1 when ``||w||`` or the denominator is 0
    (a freshly zero-initialised bias would otherwise never move).
    """
    w_norm, g_norm = float(torch.linalg.vector_norm(weight)), float(torch.linalg.vector_norm(grad))
    denom = g_norm + weight_decay * w_norm
    return eta * w_norm / denom if w_norm > 0 and denom > 0 else 1.0


def lamb_trust_ratio(weight: torch.Tensor, adam_step: torch.Tensor, weight_decay: float = 0.0) -> float:
    """LAMB's layer-wise trust ratio (You et al. 2020): ``||w|| / ||u||`` with ``u = adam_step + weight_decay * w``.

    ``adam_step`` is Adam's bias-corrected ``m_hat / (sqrt(v_hat) + eps)``; the layer moves by ``lr * ratio * u``.
    1 when either norm is 0.
    """
    u = adam_step + weight_decay * weight
    w_norm, u_norm = float(torch.linalg.vector_norm(weight)), float(torch.linalg.vector_norm(u))
    return w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0


def large_batch_run(name: str, global_batch: int, epochs: int = 1, n_train: int = 1024, dim: int = 16,
                    hidden: int = 64, base_batch: int = 32, warmup_frac: float = 0.1, seed: int = 0,
                    device=None) -> dict:
    """Train an MLP on ``teacher_classification`` with optimizer ``name`` at ``global_batch`` (one process).

    The lr follows :data:`RECIPES` (scaled from ``base_batch``), with linear warmup over ``warmup_frac``
    of the steps. The same number of epochs at every batch size, so larger batches take fewer steps.
    Model and data live on ``device`` (default: this rank's); the clock waits for it.
    Returns ``{"name", "global_batch", "lr", "losses" (per step), "seconds" (cumulative), "test_acc"}``.
    """
    X, y = teacher_classification(n_train, dim=dim, n_classes=4, seed=seed)
    Xt, yt = teacher_classification(1024, dim=dim, n_classes=4, seed=seed, label_noise=0.0)
    Xt, yt = Xt[-512:], yt[-512:]
    device = rank_device(device)
    X, y, Xt, yt = X.to(device), y.to(device), Xt.to(device), yt.to(device)
    steps = max(1, epochs * n_train // global_batch)
    base_lr, rule = RECIPES[name]
    lr = scaled_lr(base_lr, global_batch, base_batch, rule)
    torch.manual_seed(seed)
    model = MLP(dim, 4, hidden=hidden).to(device)        # initialised on the CPU: the same weights on any device
    opt, sched = make_optimizer_and_schedule(name, model.parameters(), lr, warmup_steps=max(1, int(warmup_frac * steps)))
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_train, generator=g).to(device)          # a CPU generator: the same order on any device
    losses, seconds, t0 = [], [], now(device)
    for step in range(steps):
        idx = perm[(torch.arange(global_batch, device=device) + step * global_batch) % n_train]
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        seconds.append(now(device) - t0)
    with torch.no_grad():
        acc = (model(Xt).argmax(1) == yt).float().mean().item()
    return dict(name=name, global_batch=global_batch, lr=lr, losses=losses, seconds=seconds, test_acc=acc)


def run_share(configs: list[dict]) -> list[dict]:
    """Run this rank's share (every world_size-th) of a list of :func:`large_batch_run` keyword sets."""
    return [large_batch_run(**cfg) for cfg in configs[dist.rank()::dist.world_size()]]
