"""test_exercises_federated: a FedAvg round written another way passes; one that does not train is described."""
from tests.ranks._on_ranks import finish, run_checker

import torch
from torch import nn

def by_hand(model, global_params, X, Y, local_epochs, lr, batch_size, allreduce):
    params = list(model.parameters())
    with torch.no_grad():                         # copy the global model in, parameter by parameter
        i = 0
        for p in params:
            p.copy_(global_params[i:i + p.numel()].view_as(p))
            i += p.numel()
    for _ in range(local_epochs):
        for s in range(0, len(X), batch_size):
            loss = nn.functional.cross_entropy(model(X[s:s + batch_size]), Y[s:s + batch_size])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * g
    w = torch.cat([p.detach().reshape(-1) for p in params])
    n = allreduce(torch.tensor([float(len(X))], dtype=w.dtype, device=w.device))
    return allreduce(w * (len(X) / n))
v = run_checker("fedavg_round", by_hand)
assert v.ok, v.message

def untrained(model, global_params, X, Y, local_epochs, lr, batch_size, allreduce):
    n = allreduce(torch.tensor([float(len(X))], dtype=global_params.dtype))
    return allreduce(global_params * len(X)) / n
v = run_checker("fedavg_round", untrained)
assert not v.ok and "differs from the reference" in v.message, v.message

finish()
