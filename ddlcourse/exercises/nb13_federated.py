"""Exercises of notebooks/13_federated.ipynb."""
import numpy as np

from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("fedavg_weight", "a device's weight is its share of all samples")
def fedavg_weight(counts, client: int) -> float:
    return counts[client] / sum(counts)


@exercise("fedavg_upload_mib", "clients x rounds x parameters x 4 bytes; 1 MiB = 2**20 bytes")
def fedavg_upload_mib(n_clients: int, n_params: int, rounds: int) -> float:
    return n_clients * rounds * n_params * 4 / 2**20


# --------------------------------------------------------------------------- coding exercise: the averaging round
def _average_variant(kind: str):
    """Typical wrong server averages ``(flat, n_local, allreduce) -> tensor``."""
    import torch

    def avg(flat, n_local, allreduce):
        n_clients = allreduce(torch.ones(1, dtype=flat.dtype))[0]
        if kind == "unweighted":
            return allreduce(flat.clone()) / n_clients
        if kind == "count_sum":                               # weighted by counts, never divided by the total
            return allreduce(flat * n_local)
        if kind == "local_share":                             # divided by the number of clients, not samples
            return allreduce(flat * n_local) / (n_clients * n_local)
        raise ValueError(kind)
    return avg


@code_exercise("fedavg_round", distributed=True)
def check_fedavg_round(fn, **_) -> Verdict:
    """On every rank (one client each): ``fn(flat, n_local, allreduce) -> tensor``, the new global parameters
    after one round: the clients' flattened parameters ``flat`` averaged with weights n_k / n. ``allreduce(t)``
    sums ``t`` in place over the clients and returns it. Client r holds 10 * (r + 1) ** 2 samples (unequal on
    purpose). Against ``federated.weighted_average``."""
    import torch
    import torch.distributed as tdist

    from ddlcourse import dist, federated
    dist.init(horovod=False)
    r = dist.rank()
    g = torch.Generator().manual_seed(300 + r)
    flat = torch.randn(12, generator=g, dtype=torch.float64) + r             # this client's parameters
    n_local = 10 * (r + 1) ** 2

    def allreduce(t):
        tdist.all_reduce(t)
        return t

    def run(f):
        return np.asarray(torch.as_tensor(f(flat.clone(), n_local, allreduce)).detach(), dtype=float).reshape(-1)

    ref = run(lambda w, n, _ar: federated.weighted_average(w, n))
    mistakes = {
        "you took the plain mean over the clients: FedAvg weights each client by its share of the samples, "
        "n_k / n, so a client with more data counts more": run(_average_variant("unweighted")),
        "you weighted by the sample counts but did not divide by the total count n (all-reduce it too)":
            run(_average_variant("count_sum")),
        "the weights must be n_k / n, the share of all samples, not divided by the number of clients":
            run(_average_variant("local_share")),
    }
    return diagnose(run(fn), ref, mistakes, rtol=1e-9, atol=1e-12, what=f"client {r}'s new parameters")
