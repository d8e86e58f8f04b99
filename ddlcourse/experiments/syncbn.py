"""Notebook 11 · SyncBatchNorm (:mod:`ddlcourse.parallel.syncbn`) against batch norm on the full batch, and batch
norm trained three ways."""
from __future__ import annotations

import torch
from torch import nn
import torch.distributed as tdist
from torch.nn import functional as F

from ddlcourse import dist
from ddlcourse.data.toy import shapes
from ddlcourse.device import rank_device
from ddlcourse.models.small import SmallCNN
from ddlcourse.parallel.data_parallel import unwrap, wrap
from ddlcourse.parallel.syncbn import _allreduce_, _reduce_dims, convert_sync_batchnorm


def stat_noise(x: torch.Tensor, batch_sizes, n_draws: int = 200, seed: int = 0) -> dict:
    """Spread (std over random batches) of the per-channel batch mean and variance, per batch size.

    ``x``: (N, C, ...) activations of the whole data set. Small batches give noisy statistics, and batch
    norm trains on those noisy statistics but tests with the running averages.
    """
    g = torch.Generator().manual_seed(seed)
    dims = _reduce_dims(x)
    out = {}
    for b in batch_sizes:
        means, vars_ = [], []
        for _ in range(n_draws):
            xb = x[torch.randperm(x.shape[0], generator=g).to(x.device)[:b]]   # a CPU generator, then x's device
            means.append(xb.mean(dims))
            vars_.append(xb.var(dims, unbiased=False))
        out[int(b)] = (torch.stack(means).std(0).mean().item(), torch.stack(vars_).std(0).mean().item())
    return out


BN_MODES = ("serial", "local", "sync")


def bn_experiment(mode: str, global_batch: int, steps: int, n_train: int = 256, n_test: int = 256,
                  image_size: int = 16, width: int = 8, lr: float = 0.05, seed: int = 0,
                  n_ranks: int | None = None, device=None) -> dict | None:
    """Train ``SmallCNN`` on the shapes images with batch norm three ways; runs on every rank.

    ``serial``: one process on the whole global batch (the reference, every rank computes it alone);
    ``local``: DDP over ``n_ranks`` ranks with ordinary per-rank BatchNorm (each normalises with the
    statistics of its own micro-batch); ``sync``: the same with :class:`SyncBatchNorm`.
    Returns ``{"losses", "test_acc", "train_acc"}`` (None on ranks left out). Model and data live on
    ``device`` (default: the rank's, ``dist.init().device``).
    """
    if mode not in BN_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(BN_MODES)}")
    dist.init()
    device = rank_device(device)
    group, world, r = None, 1, 0
    if mode != "serial":
        comm, group = dist.subgroup(n_ranks or dist.world_size())
        if comm is None:
            return None
        world, r = comm.Get_size(), comm.Get_rank()
    if global_batch % world:
        raise ValueError(f"global_batch {global_batch} must be divisible by the {world} ranks")
    X, y = shapes(n_train, size=image_size, seed=seed)
    Xt, yt = shapes(n_test, size=image_size, seed=seed + 1)
    X, y, Xt, yt = X.to(device), y.to(device), Xt.to(device), yt.to(device)
    torch.manual_seed(seed)
    model = SmallCNN(1, 3, width).to(device)
    if mode == "sync":
        model = convert_sync_batchnorm(model, group)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if mode != "serial":
        model, opt = wrap(model, opt, backend="ddp", group=group)
    losses = []
    for step in range(steps):
        idx = (torch.arange(global_batch, device=device) + step * global_batch) % n_train
        mine = idx[r::world]                                     # (micro_batch,) this rank's share
        loss = F.cross_entropy(model(X[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
        lg = loss.detach().clone()
        if world > 1:
            tdist.all_reduce(lg, group=group)
        losses.append(lg.item() / world)
    net = unwrap(model).eval()                                   # test with the running statistics
    with torch.no_grad():
        test_acc = (net(Xt).argmax(1) == yt).float().mean().item()
        train_acc = (net(X).argmax(1) == y).float().mean().item()
    return {"losses": losses, "test_acc": test_acc, "train_acc": train_acc}


def compare_with_full_batch(channels: int = 5, spatial=(4, 4), seed: int = 0, device=None) -> dict:
    """Largest differences between SyncBatchNorm on this rank's slice and ``nn.BatchNorm`` on the whole batch.

    Runs on every rank of the world (``dist.init`` first). Rank r takes ``2 + r`` samples of one global batch
    (unequal on purpose). Weight/bias gradients are summed over ranks before comparing, as data parallelism does.
    Everything lives on ``device`` (default: the rank's).
    """
    import copy

    dist.init()
    device = rank_device(device)
    r, n = dist.rank(), dist.world_size()
    sizes = [2 + k for k in range(n)]
    lo, hi = sum(sizes[:r]), sum(sizes[:r + 1])
    cls = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[len(spatial)]
    torch.manual_seed(seed)
    ref = cls(channels)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2.0)
        ref.bias.uniform_(-1, 1)
    ref = ref.to(device)                          # drawn on the CPU: the same numbers on any device
    mine = convert_sync_batchnorm(copy.deepcopy(ref))
    g = torch.Generator().manual_seed(seed)
    diff = dict(output=0.0, input_grad=0.0)
    for _ in range(2):
        # drawn on the CPU (the same numbers on every device), then moved
        X = (torch.randn(sum(sizes), channels, *spatial, generator=g) * 2 + 1).to(device)   # (global_batch, C, ...)
        R = torch.randn(X.shape, generator=g).to(device)                                    # a fixed loss direction
        xf = X.clone().requires_grad_()
        yf = ref(xf)
        (yf * R).sum().backward()
        xl = X[lo:hi].clone().requires_grad_()
        yl = mine(xl)
        (yl * R[lo:hi]).sum().backward()
        diff["output"] = max(diff["output"], (yl - yf[lo:hi]).abs().max().item())
        diff["input_grad"] = max(diff["input_grad"], (xl.grad - xf.grad[lo:hi]).abs().max().item())
    gw, gb = mine.weight.grad.clone(), mine.bias.grad.clone()
    _allreduce_(gw, None)
    _allreduce_(gb, None)
    # gradients are sums over many values: compare relative to their size
    diff["weight_grad"] = ((gw - ref.weight.grad).abs().max() / ref.weight.grad.abs().max().clamp(min=1)).item()
    diff["bias_grad"] = ((gb - ref.bias.grad).abs().max() / ref.bias.grad.abs().max().clamp(min=1)).item()
    diff["running_mean"] = (mine.running_mean - ref.running_mean).abs().max().item()
    diff["running_var"] = (mine.running_var - ref.running_var).abs().max().item()
    from mpi4py import MPI
    return {k: dist._comm().allreduce(v, op=MPI.MAX) for k, v in diff.items()}
