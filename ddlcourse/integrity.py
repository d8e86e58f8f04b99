"""Loss integrity: the same global batch must give the same loss trajectory on 1 and on N ranks (notebook 03).

One training function, :func:`train_on_ranks`, runs serially or on the ranks of a (sub)group. It does the
five data-parallel steps by hand so that each can be broken on purpose with ``mistake=``:

=====================  =====================================================================================
``"none"``             correct: sharded sampler, global-mean loss, gradients averaged over the ranks
``"sum_grads"``        gradients summed over the ranks instead of averaged (the step is ``world_size`` x too big)
``"mean_of_means"``    each rank's own mean loss, then the mean over ranks: wrong when the shares differ in size
``"sampler_padding"``  ``DistributedSampler`` padding: the epoch is padded by repeating samples
``"sampler_drop_last"`` ``DistributedSampler(drop_last=True)``: the tail of the epoch is never seen
``"same_aug_seed"``    every rank seeds its augmentation identically: the ranks add the *same* noise
``"per_rank_bn"``      plain BatchNorm: statistics of the rank's share instead of the global batch
=====================  =====================================================================================

The sixth mistake of the notebook, a learning rate not scaled to the global batch, is not a switch: it is a
different configuration (:func:`weak_scaling`), where the global batch grows with the ranks.

On an ipyparallel cluster (every engine calls it; ranks outside the subgroup return ``None``)::

    losses = c.run(integrity.run, 4, "none", epochs=3)[0]
    table = c.run(integrity.run_all, [("1 rank", 1, "none", {}), ("4 ranks", 4, "none", {})])[0]

Everything is float64 by default so that a correct run agrees with the serial one to ~1e-12: the only
difference left is the order in which the allreduce adds the ranks' gradients.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.distributed as tdist
from torch import nn
from torch.nn import functional as F

from ddlcourse import dist, losses as L, sharding
from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.optim import scaled_lr, warmup_factor
from ddlcourse.parallel.data_parallel import average_gradients, broadcast_parameters
from ddlcourse.parallel.syncbn import convert_sync_batchnorm

MISTAKES = {
    "none": "correct: sharded sampler, global-mean loss, averaged gradients",
    "sum_grads": "gradients summed, not averaged",
    "mean_of_means": "mean of per-rank mean losses (uneven shares)",
    "sampler_padding": "DistributedSampler padding (repeated samples)",
    "sampler_drop_last": "DistributedSampler drop_last (samples never seen)",
    "same_aug_seed": "same augmentation seed on every rank",
    "per_rank_bn": "per-rank batch-norm statistics",
    "no_set_epoch": "sampler.set_epoch never called (every epoch repeats epoch 0's order)",
}


@dataclass(frozen=True)
class IntegrityConfig:
    n_samples: int = 202        # not a multiple of global_batch nor of the ranks: the last batch is uneven
    dim: int = 16
    n_classes: int = 4
    hidden: int = 32
    global_batch: int = 32
    epochs: int = 3
    lr: float = 0.2
    momentum: float = 0.9
    warmup_steps: int = 0
    aug_noise: float = 0.3      # input jitter (the "augmentation"); 0 turns it off
    batchnorm: bool = False     # BatchNorm1d after the first layer (synchronised across ranks unless per_rank_bn)
    seed: int = 0
    dtype: str = "float64"


def make_config(**overrides) -> IntegrityConfig:
    unknown = set(overrides) - set(asdict(IntegrityConfig()))
    if unknown:
        raise ValueError(f"unknown IntegrityConfig field(s) {sorted(unknown)}; known: {sorted(asdict(IntegrityConfig()))}")
    return replace(IntegrityConfig(), **overrides)


def weak_scaling(k: int, micro_batch: int, base_lr: float, rule: str = "none", warmup_steps: int = 0) -> dict:
    """Overrides for ``k`` ranks that each keep ``micro_batch`` samples: global batch ``k * micro_batch``, lr by ``rule``."""
    gb = k * micro_batch
    return dict(global_batch=gb, lr=scaled_lr(base_lr, gb, micro_batch, rule), warmup_steps=warmup_steps)


# --------------------------------------------------------------------------- pieces
def build_model(cfg: IntegrityConfig, sync_group=None, sync: bool = False, device=None) -> nn.Module:
    """The same initial weights on every rank (seeded with the rank-0 seed, then broadcast anyway), drawn on the
    CPU (the same on any device), on ``device`` (default: this rank's)."""
    torch.manual_seed(cfg.seed)
    layers = [nn.Linear(cfg.dim, cfg.hidden)]
    if cfg.batchnorm:
        layers.append(nn.BatchNorm1d(cfg.hidden))
    layers += [nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.n_classes)]
    model = nn.Sequential(*layers).to(device=rank_device(device), dtype=getattr(torch, cfg.dtype))
    if cfg.batchnorm and sync:
        model = convert_sync_batchnorm(model, group=sync_group)
    return model


def data(cfg: IntegrityConfig, device=None):
    """The whole data set ``(X, y)`` on ``device`` (default: this rank's); every rank uses only its shares."""
    X, y = teacher_classification(cfg.n_samples, cfg.dim, cfg.n_classes, seed=cfg.seed + 1)
    device = rank_device(device)
    return X.to(device=device, dtype=getattr(torch, cfg.dtype)), y.to(device)


def step_batches(cfg: IntegrityConfig, mistake: str, rank: int, world_size: int, epoch: int) -> list[np.ndarray]:
    """This rank's sample indices for every step of ``epoch``."""
    if mistake == "no_set_epoch":          # like DistributedSampler without set_epoch(epoch): the seed never moves
        epoch = 0
    if mistake in ("sampler_padding", "sampler_drop_last"):
        if cfg.global_batch % world_size:
            raise ValueError(f"DistributedSampler needs global_batch ({cfg.global_batch}) divisible by the ranks ({world_size})")
        order = sharding.epoch_permutation(cfg.n_samples, epoch, cfg.seed)   # same order as the correct run
        return sharding.padded_sampler_batches(cfg.n_samples, cfg.global_batch // world_size, rank, world_size, epoch,
                                               cfg.seed, drop_last=mistake == "sampler_drop_last", order=order)
    return sharding.sharded_batches(cfg.n_samples, cfg.global_batch, rank, world_size, epoch, cfg.seed)


def augmentation_noise(cfg: IntegrityConfig, idx: np.ndarray, epoch: int, step: int, mistake: str,
                       device=None) -> torch.Tensor:
    """Jitter for the samples ``idx``, shape (len(idx), dim), on ``device`` (default: this rank's).

    Correct: the noise is a function of (seed, epoch, *sample index*), so a sample gets the same jitter
    whichever rank holds it. Mistake: each rank draws from a generator seeded identically on every rank,
    so rank r's i-th sample gets the same noise as every other rank's i-th sample.
    Drawn with a CPU generator (the same numbers on any device), then moved.
    """
    dtype = getattr(torch, cfg.dtype)
    device = rank_device(device)
    g = torch.Generator()
    if mistake == "same_aug_seed":
        g.manual_seed(cfg.seed * 1_000_003 + 1000 * epoch + step)           # no rank in it: the bug
        return torch.randn(len(idx), cfg.dim, generator=g, dtype=dtype).to(device)
    g.manual_seed(cfg.seed * 1_000_003 + 1000 * epoch)
    table = torch.randn(cfg.n_samples, cfg.dim, generator=g, dtype=dtype)  # (n_samples, dim), one row per sample
    return table[torch.as_tensor(idx, dtype=torch.long)].to(device)


def _allreduce_sum(t: torch.Tensor, group, world_size: int) -> torch.Tensor:
    if world_size > 1:
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM, group=group)
    return t


def _sum_gradients(model: nn.Module, group) -> None:
    for p in model.parameters():
        if p.grad is not None:
            tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM, group=group)


# --------------------------------------------------------------------------- training
def train_on_ranks(cfg: IntegrityConfig, mistake: str = "none", rank: int = 0, world_size: int = 1,
                   group=None, device=None) -> list[float]:
    """Train on this rank's shares; return the global-batch mean loss of every step (the same on every rank).

    Model and batches live on ``device`` (default: this rank's, ``dist.init().device``).
    """
    if mistake not in MISTAKES:
        raise ValueError(f"unknown mistake {mistake!r}; choose one of {', '.join(MISTAKES)}")
    if mistake == "per_rank_bn" and not cfg.batchnorm:
        raise ValueError("mistake 'per_rank_bn' needs a model with batch norm: pass batchnorm=True")
    device = rank_device(device)
    X, y = data(cfg, device=device)
    # step 2-3: same initial weights everywhere; batch norm synchronised over the group unless that is the mistake
    model = build_model(cfg, group, sync=world_size > 1 and mistake != "per_rank_bn", device=device)
    if world_size > 1:
        broadcast_parameters(model, group=group)   # NEW: the same initial weights on every rank
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    history, step = [], 0
    for epoch in range(cfg.epochs):
        for idx in step_batches(cfg, mistake, rank, world_size, epoch):   # NEW: my share of the batch
            for gr in opt.param_groups:
                gr["lr"] = cfg.lr * warmup_factor(step, cfg.warmup_steps)
            mine = torch.as_tensor(idx, dtype=torch.long, device=device)
            xb, yb = X[mine], y[mine]
            if cfg.aug_noise:
                xb = xb + cfg.aug_noise * augmentation_noise(cfg, idx, epoch, step, mistake, device=device)
            per_sample = F.cross_entropy(model(xb), yb, reduction="none")      # (m_r,)
            M = L.global_count(len(idx), group) if world_size > 1 else len(idx)   # NEW: the global batch
            if mistake in ("sum_grads", "mean_of_means"):
                loss = L.naive_mean_loss(per_sample) if len(idx) else per_sample.sum()
            else:
                loss = L.global_mean_loss(per_sample, M, world_size)   # NEW: world_size * sum / M
            opt.zero_grad()
            loss.backward()
            if world_size > 1:                                                 # step 4: aggregate the gradients
                if mistake == "sum_grads":
                    _sum_gradients(model, group)
                else:
                    average_gradients(model, group)   # NEW: mean over ranks
            opt.step()
            total = _allreduce_sum(per_sample.detach().sum().reshape(1).clone(), group, world_size)
            history.append(float(total.item()) / M)
            step += 1
    return history


def serial(mistake: str = "none", device=None, **overrides) -> list[float]:
    """The reference: one process, no communication at all (on ``device``, default this process's)."""
    return train_on_ranks(make_config(**overrides), mistake, device=device)


def run(k: int, mistake: str = "none", device=None, **overrides):
    """On every engine of a cluster: train on the first ``k`` ranks (on ``device``, default the rank's,
    ``dist.init().device``); ``None`` on the others."""
    dist.init()
    dist.set_threads(1)
    comm, group = dist.subgroup(k)
    if comm is None:
        return None
    return train_on_ranks(make_config(**overrides), mistake, comm.Get_rank(), k, group, device=device)


def run_all(specs: list) -> dict | None:
    """Run several ``(label, k, mistake, overrides)`` experiments in one call; ``{label: losses}`` on rank 0."""
    out = {label: run(k, mistake, **overrides) for label, k, mistake, overrides in specs}
    return out if dist.rank() == 0 else None


def max_difference(a, b) -> float:
    """Largest absolute difference of two loss trajectories (inf when their lengths differ or one diverged)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        return float("inf")
    d = np.abs(a - b)
    return float(d.max()) if np.all(np.isfinite(d)) else float("inf")


def trajectories_agree(reference, other, atol: float = 1e-4, exact_steps: int = 10, mean_rtol: float = 1e-2) -> bool:
    """Loss integrity for float32 training runs (the labs), where :func:`max_difference` is too strict.

    On N ranks the allreduce adds the gradients in another order, so a float32 run differs from the serial
    one by rounding (~1e-7) at the first step. Training amplifies that difference a little at each step:
    after a few tens of steps two *correct* runs differ by 1e-2 at single steps, though neither is wrong.
    So the first ``exact_steps`` steps must agree within ``atol``: there only rounding separates them, and a
    real mistake (summed gradients, a wrong learning rate, missing samples) already shows. Over the whole
    run, the mean loss must agree within ``mean_rtol``. Trajectories of different lengths never agree.
    """
    a, b = np.asarray(reference, float), np.asarray(other, float)
    if a.size == 0 or max_difference(a, b) == float("inf"):    # lengths differ, or a run diverged
        return False
    mean_gap = abs(a.mean() - b.mean()) / max(abs(a.mean()), 1e-12)
    return max_difference(a[:exact_steps], b[:exact_steps]) <= atol and mean_gap <= mean_rtol


def plot_trajectories(curves: dict, ax=None, title: str | None = None, x_scale: dict | None = None,
                      xlabel: str = "step"):
    """Loss curves ``label -> losses``; ``x_scale[label]`` multiplies the x axis (e.g. samples per step)."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(4.4, 3.2))
    for i, (label, ys) in enumerate(curves.items()):
        xs = np.arange(1, len(ys) + 1) * (x_scale or {}).get(label, 1)
        ax.plot(xs, ys, lw=2.2 - 0.4 * min(i, 3), label=label)
    ax.set(xlabel=xlabel, ylabel="global-batch loss")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_deviation(reference, curves: dict, ax=None, tol: float | None = None):
    """``|loss - reference|`` per step, log scale: a correct run sits at round-off, a mistake far above."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 3.4))
    ref = np.asarray(reference, float)
    for label, ys in curves.items():
        ys = np.asarray(ys, float)
        n = min(len(ys), len(ref))
        d = np.abs(ys[:n] - ref[:n])
        ax.semilogy(np.arange(1, n + 1), np.maximum(d, 1e-17), ".-", ms=3, lw=1, label=label)
    if tol is not None:
        ax.axhline(tol, color="k", ls="--", lw=0.8, label=f"tolerance {tol:g}")
    ax.set(xlabel="step", ylabel="|loss - 1-rank loss|", ylim=(1e-17, 10))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return ax


# --------------------------------------------------------------------------- comparing the labs' runs on 1, 2, 4 ranks
def max_rel_diff(a, b) -> float:
    """Largest relative difference ``|a - b| / |b|`` of two loss trajectories over their common steps."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = min(len(a), len(b))
    if n == 0:
        raise ValueError("no common steps to compare")
    return float(np.max(np.abs(a[:n] - b[:n]) / np.abs(b[:n])))


def losses_agree(reference, other, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """Same length, and every step within ``atol + rtol * |reference|`` (``np.allclose``): the strict check."""
    a, b = np.asarray(reference, float), np.asarray(other, float)
    return a.shape == b.shape and a.size > 0 and bool(np.allclose(b, a, rtol=rtol, atol=atol))


def compare_runs(runs: dict, reference=1, check=None) -> dict:
    """``{label: agrees with runs[reference]}`` for every other run (``runs``: label -> loss trajectory).

    ``check(reference, other) -> bool`` defaults to :func:`trajectories_agree` (float32 training).
    """
    if reference not in runs:
        raise KeyError(f"no reference run {reference!r} among {list(runs)}")
    check = check or trajectories_agree
    return {k: bool(check(runs[reference], v)) for k, v in runs.items() if k != reference}


def plot_rel_deviation(reference, curves: dict, ax=None):
    """``|loss - reference| / reference`` per step, one line per run (log scale)."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.2))
    ref = np.asarray(reference, float)
    for label, loss in curves.items():
        n = min(len(ref), len(loss))
        ax.semilogy(np.abs(np.asarray(loss[:n], float) - ref[:n]) / np.abs(ref[:n]) + 1e-9, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("relative difference to 1 rank")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax
