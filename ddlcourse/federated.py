"""Federated averaging (FedAvg, McMahan et al., 2017) over ranks that play the "devices".

Each client (rank) keeps its own data and never sends it. One *communication round*:

1. every client starts from the global model,
2. trains ``local_epochs`` epochs of SGD on its own data,
3. the server averages the clients' models, weighted by their number of samples (here: one allreduce).

With IID partitions this behaves much like centralized training. With non-IID partitions (each device sees
mostly a few classes, as phones or sensors do) the local models drift apart during the local epochs and the
average learns more slowly. With one local full-batch gradient step per round FedAvg *is* centralized
gradient descent; the tests use that as the serial equivalent.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.models.small import MLP

DIM, N_CLASSES = 16, 4


def partition(y: torch.Tensor, n_clients: int, mode: str = "iid", alpha: float = 0.3, seed: int = 0) -> list[np.ndarray]:
    """Indices of each client's samples. ``iid``: random equal shares. ``noniid``: per class, the samples are
    split over clients with proportions drawn from Dirichlet(``alpha``) (small ``alpha``: few classes each)."""
    g = np.random.default_rng(seed)
    labels = _host(y)
    n = len(labels)
    if mode == "iid":
        return [np.sort(p) for p in np.array_split(g.permutation(n), n_clients)]
    if mode != "noniid":
        raise ValueError(f"unknown partition mode {mode!r}; use 'iid' or 'noniid'")
    parts = [[] for _ in range(n_clients)]
    for c in np.unique(labels):
        idx = g.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(g.dirichlet([alpha] * n_clients)) * len(idx)).astype(int)[:-1]
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].extend(chunk.tolist())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def label_histogram(y: torch.Tensor, parts: list[np.ndarray]) -> np.ndarray:
    """(n_clients, n_classes) counts: what each device sees."""
    labels = _host(y)
    return np.stack([np.bincount(labels[p], minlength=N_CLASSES) for p in parts])


def _host(y) -> np.ndarray:
    """Labels as a NumPy array, from a tensor on any device."""
    return y.cpu().numpy() if torch.is_tensor(y) else np.asarray(y)


def _model(seed: int, hidden: int, device=None) -> nn.Module:
    torch.manual_seed(seed)                               # the same initial global model everywhere (drawn on the CPU)
    return MLP(DIM, N_CLASSES, hidden=hidden, depth=2).to(rank_device(device))


def _accuracy(model, X, Y) -> float:
    with torch.no_grad():
        return (model(X).argmax(1) == Y).float().mean().item()


def _local_train(model, X, Y, epochs: int, batch_size: int | None, lr: float, seed: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)               # on the CPU: the same order on any device
    bs = batch_size or len(X)
    for _ in range(epochs):
        order = (torch.randperm(len(X), generator=g).to(X.device) if batch_size
                 else torch.arange(len(X), device=X.device))
        for i in range(0, len(X), bs):
            idx = order[i:i + bs]
            opt.zero_grad()
            loss_fn(model(X[idx]), Y[idx]).backward()
            opt.step()


def data(n_train: int, n_test: int, seed: int = 0, device=None):
    """The whole training set (every rank can generate it; each client only *uses* its part) and a test set,
    on ``device`` (default: this rank's)."""
    X, Y = teacher_classification(n_train + n_test, dim=DIM, n_classes=N_CLASSES, seed=seed, label_noise=0.0)
    device = rank_device(device)
    X, Y = X.to(device), Y.to(device)
    return X[:n_train], Y[:n_train], X[n_train:], Y[n_train:]


def fedavg(rounds: int, local_epochs: int = 1, mode: str = "noniid", n_train: int = 2000, n_test: int = 1000,
           batch_size: int | None = 32, lr: float = 0.1, hidden: int = 32, alpha: float = 0.3, group=None,
           seed: int = 0, device=None) -> dict:
    """Run on every rank of ``group`` (rank = client), on ``device`` (default: this rank's). Returns
    ``dict(acc, n_local, params)``: test accuracy of the global model after each round, this client's sample
    count, and the final flattened parameters (on the CPU)."""
    device = rank_device(device)
    r, n = tdist.get_rank(group), tdist.get_world_size(group)
    X, Y, Xt, Yt = data(n_train, n_test, seed, device=device)
    mine = partition(Y, n, mode, alpha, seed)[r]                            # indices, on the host
    idx = torch.as_tensor(mine, dtype=torch.long, device=device)
    Xl, Yl = X[idx], Y[idx]
    model = _model(seed, hidden, device=device)
    total = torch.tensor([float(len(mine))], device=device)
    tdist.all_reduce(total, group=group)
    weight = len(mine) / total.item()
    acc = []
    for rnd in range(rounds):
        if len(mine):
            _local_train(model, Xl, Yl, local_epochs, batch_size, lr, seed=seed + 1000 * r + rnd)
        with torch.no_grad():                               # the server's weighted average, as one allreduce
            flat = nn.utils.parameters_to_vector(model.parameters()) * weight
            tdist.all_reduce(flat, group=group)
            nn.utils.vector_to_parameters(flat, model.parameters())
        acc.append(_accuracy(model, Xt, Yt))
    return dict(acc=acc, n_local=len(mine), params=torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu())


def weighted_average(flat: torch.Tensor, n_local: int, group=None) -> torch.Tensor:
    """The server's half of a FedAvg round, on every client rank of ``group``: the average of the clients'
    flattened parameters ``flat`` weighted by their sample counts, sum_k (n_k / n) w_k, as allreduces
    (McMahan et al., 2017). Returns a new tensor on ``flat``'s device; ``flat`` is left as it was."""
    total = torch.tensor([float(n_local)], dtype=flat.dtype, device=flat.device)
    tdist.all_reduce(total, group=group)
    if total.item() <= 0:
        raise ValueError("no client holds any sample")
    out = flat * (n_local / total.item())
    tdist.all_reduce(out, group=group)
    return out


def centralized(epochs: int, n_train: int = 2000, n_test: int = 1000, batch_size: int | None = 32, lr: float = 0.1,
                hidden: int = 32, seed: int = 0, device=None) -> dict:
    """The same model trained on all data in one place (on ``device``, default this process's); accuracy after
    each epoch, and the final flattened parameters (on the CPU)."""
    device = rank_device(device)
    X, Y, Xt, Yt = data(n_train, n_test, seed, device=device)
    model = _model(seed, hidden, device=device)
    acc = []
    for e in range(epochs):
        _local_train(model, X, Y, 1, batch_size, lr, seed=seed + e)
        acc.append(_accuracy(model, Xt, Yt))
    return dict(acc=acc, params=torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu())


def compare_with_serial(rounds: int = 3, mode: str = "noniid", n_train: int = 256, group=None, device=None) -> float:
    """FedAvg with one full-batch local step per round equals centralized gradient descent: max param diff."""
    fed = fedavg(rounds, 1, mode, n_train, 64, batch_size=None, lr=0.5, group=group, device=device)
    cen = centralized(rounds, n_train, 64, batch_size=None, lr=0.5, device=device)
    return (fed["params"] - cen["params"]).abs().max().item()
