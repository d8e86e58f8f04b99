"""Checkers of notebooks/10_federated.ipynb: the reference answers of its questions, and the checker of the FedAvg
round the learner builds."""
import numpy as np

from ddlcourse import dist, federated
from ddlcourse.exercises.solutions.federated import ROUND_VARIANTS, _round_variant
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("fedavg_weight", "a device's weight is its share of all samples")
def fedavg_weight(counts, client: int) -> float:
    return counts[client] / sum(counts)


@exercise("fedavg_upload_mib", "clients x rounds x parameters x 4 bytes; 1 MiB = 2**20 bytes")
def fedavg_upload_mib(n_clients: int, n_params: int, rounds: int) -> float:
    return n_clients * rounds * n_params * 4 / 2**20


# --------------------------------------------------------------------------- build it: one FedAvg round on the ranks
# client r holds _COUNTS[r] samples (unequal on purpose, and not multiples of the batch size)
_COUNTS = [9, 22, 14, 31]
_BATCH, _EPOCHS, _LR, _HIDDEN = 4, 2, 0.3, 8


_ROUND_HINTS = {
    "unweighted": "you took the plain mean over the clients: FedAvg weights each client by its share of the "
                  "samples, n_k / n, so a client with more data counts more",
    "stale": "the local training did not start from the global model: load global_params into the model "
             "first (nn.utils.vector_to_parameters), or the clients keep drifting on their own",
    "local_count": "you divided by this client's own count: divide by the total count n over all clients "
                   "(all-reduce the counts too)",
    "count_sum": "you weighted by the sample counts but did not divide by the total count n (all-reduce it too)",
}


@code_exercise("fedavg_round", distributed=True, ranks=(2, 3))
def check_fedavg_round(fn, **_) -> Verdict:
    """On every rank (one client each): ``fn(model, global_params, X, Y, local_epochs, lr, batch_size,
    allreduce)`` -> the new global parameters, a flat tensor. The model arrives with stale parameters (its
    own from the last round). Compared with the reference round on the same ranks, and, with one full-batch
    step, with one step of centralized gradient descent on all the clients' data (the serial run)."""
    import torch
    import torch.distributed as tdist
    from torch import nn

    info = dist.init()
    r, ws, dev = info.rank, info.world_size, info.device
    counts = _COUNTS[:ws] if ws <= len(_COUNTS) else [_COUNTS[k % len(_COUNTS)] for k in range(ws)]
    X, Y, _, _ = federated.data(sum(counts), 1, seed=3, device=dev)
    X = X.double()
    start = sum(counts[:r])
    Xr, Yr = X[start:start + counts[r]], Y[start:start + counts[r]]
    global_model = federated._model(0, _HIDDEN, device=dev).double()
    g = nn.utils.parameters_to_vector(global_model.parameters()).detach().clone()

    def allreduce(t):
        tdist.all_reduce(t)
        return t

    def run(f, epochs, batch):
        model = federated._model(0, _HIDDEN, device=dev).double()
        with torch.no_grad():                                   # what this client had after the last round
            stale = g + 0.5 * torch.randn(g.shape, generator=torch.Generator().manual_seed(50 + r),
                                          dtype=g.dtype).to(dev)
            nn.utils.vector_to_parameters(stale, model.parameters())
        out = f(model, g.clone(), Xr.clone(), Yr.clone(), epochs, _LR, batch, allreduce)
        return np.asarray(torch.as_tensor(out).detach().cpu(), dtype=float).reshape(-1)

    for epochs, batch in ((_EPOCHS, _BATCH), (1, max(counts))):
        got = run(fn, epochs, batch)
        # the package's fedavg shuffles its local batches: the reference round (in order) of the solutions module
        ref = run(_round_variant(), epochs, batch)
        if batch >= max(counts):                                # serial: one GD step on all the data
            central = federated._model(0, _HIDDEN, device=dev).double()
            nn.functional.cross_entropy(central(X), Y).backward()
            serial = (g - _LR * nn.utils.parameters_to_vector([p.grad for p in central.parameters()])).detach()
            assert np.allclose(ref, serial.cpu().numpy(), atol=1e-10), "the reference is not FedAvg"
        wrong = {h: run(ROUND_VARIANTS[k], epochs, batch) for k, h in _ROUND_HINTS.items()}
        v = diagnose(got, ref, wrong, rtol=1e-7, atol=1e-9,
                     what=f"client {r}'s new global parameters ({epochs} local epoch(s), batch {batch})")
        bad = torch.tensor([0.0 if v.ok else 1.0], dtype=torch.float64, device=dev)
        tdist.all_reduce(bad)                                   # every rank stops at the same case
        if bad.item() > 0:
            return v if not v.ok else Verdict(False, "right on this rank, wrong on another one")
    return Verdict(True)
