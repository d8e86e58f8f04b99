"""Reference solutions of notebooks/10_federated.ipynb: one FedAvg round on a client as a learner writes it, and the
round with one typical mistake each (what its checker, :mod:`ddlcourse.exercises.checkers.federated`, must name)."""
from ddlcourse.selfcheck import reference


def _round_variant(kind: str | None = None):
    """``fn(model, global_params, X, Y, local_epochs, lr, batch_size, allreduce)``: the reference (None) or
    one typical mistake."""
    import torch
    from torch import nn

    def fn(model, global_params, X, Y, local_epochs, lr, batch_size, allreduce):
        if kind != "stale":
            with torch.no_grad():
                nn.utils.vector_to_parameters(global_params.clone(), model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(local_epochs):
            for i in range(0, len(X), batch_size):
                opt.zero_grad()
                nn.functional.cross_entropy(model(X[i:i + batch_size]), Y[i:i + batch_size]).backward()
                opt.step()
        with torch.no_grad():
            w = nn.utils.parameters_to_vector(model.parameters())
            ones = allreduce(torch.ones(1, dtype=w.dtype, device=w.device))
            n = allreduce(torch.tensor([float(len(X))], dtype=w.dtype, device=w.device))
            if kind == "unweighted":
                return allreduce(w.clone()) / ones
            if kind == "local_count":                     # the counts were never all-reduced
                return allreduce(w * len(X)) / len(X)
            if kind == "count_sum":
                return allreduce(w * len(X))
            return allreduce(w * len(X)) / n
    return fn


def _round_solution(model, global_params, X, Y, local_epochs, lr, batch_size, allreduce):
    """One FedAvg round on this client: local SGD from the global model, then the weighted average."""
    import torch
    from torch import nn
    with torch.no_grad():                                   # every client starts from the global model
        nn.utils.vector_to_parameters(global_params.clone(), model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(local_epochs):
        for i in range(0, len(X), batch_size):              # in order; the last batch may be smaller
            opt.zero_grad()
            loss_fn(model(X[i:i + batch_size]), Y[i:i + batch_size]).backward()
            opt.step()
    with torch.no_grad():
        w = nn.utils.parameters_to_vector(model.parameters())
        n = allreduce(torch.tensor([float(len(X))], dtype=w.dtype, device=w.device))   # all samples
        return allreduce(w * len(X)) / n                    # sum over clients of (n_k / n) w_k


ROUND_VARIANTS = {kind: _round_variant(kind) for kind in ("unweighted", "stale", "local_count", "count_sum")}

reference("fedavg_round", mistakes=[
    (ROUND_VARIANTS["unweighted"], "plain mean"), (ROUND_VARIANTS["stale"], "start from the global model"),
    (ROUND_VARIANTS["local_count"], "all-reduce the counts"), (ROUND_VARIANTS["count_sum"], "did not divide")])(
    _round_solution)
