"""test_cluster_scale_claims: the checked comparisons of notebooks 05 and 06 with serial training, at the cluster
profile's ranks, steps and learning rates. ``sys.argv[1]``: the MLP's width (only wall time depends on it), and
``sys.argv[2]``, optional: "final" checks the parameters after the whole run within 1e-5, as both notebooks did
before issue 45. Rank 0 prints ``{claim: verdict}`` and the figures behind them."""
import sys

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

from ddlcourse import config, dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.experiments import data_parallel as exp
from ddlcourse.models.small import MLP
from ddlcourse.parallel import data_parallel as dp

S = config.sizes("data_parallel", "cluster", hidden=int(sys.argv[1]))
final_only = sys.argv[2:] == ["final"]
info = dist.init()
dist.set_threads(1)
assert info.world_size == S.n_ranks, f"run on the cluster profile's {S.n_ranks} ranks, not {info.world_size}"


def agrees(serial: dict, run: dict) -> bool:
    """The notebooks' check (or, with "final", the one they made before issue 45)."""
    if final_only:
        return float(np.abs(run["params"] - serial["params"]).max()) < 1e-5
    return exp.agrees_with_serial(serial, run)


kw = dict(steps=S.steps, global_batch=S.global_batch, n_train=S.n_train, dim=S.dim, hidden=S.hidden)
claims, figures = {}, {}
# notebook 05, cell 12: the ways against serial, SGD with momentum and Adam (the ways with one allreduce per
# parameter tensor add in the same order as DDP's bucket, only slower on oversubscribed CPU ranks)
for optname, lr in (("sgd", 0.2), ("adam", 0.01)):
    ref = exp.train_way("serial", optimizer=optname, lr=lr, **kw)
    for way in ("ddp", "horovod"):
        run = exp.train_way(way, optimizer=optname, lr=lr, **kw)
        claims[f"05 {optname} {way}"] = agrees(ref, run)
        figures[f"05 {optname} {way}"] = float(np.abs(run["params"] - ref["params"]).max())

# notebook 06, cell 8: Horovod's fp16 compression against serial (SGD with momentum, lr 0.2)
ref = exp.train_way("serial", lr=0.2, **kw)
half = exp.train_way("horovod", compression="fp16", lr=0.2, **kw)
d_half = float(np.abs(half["params_first"] - ref["params_first"]).max())
loss_gap = abs(half["losses"][-1] - ref["losses"][-1]) / ref["losses"][-1]
claims["06 fp16"] = d_half > 1e-6 and loss_gap < 0.05
figures["06 fp16"] = (d_half, loss_gap)

# notebook 06, cells 10 and 12: gradient accumulation over 2 micro-batches per rank, with and without no_sync
X, y = teacher_classification(S.n_train, dim=S.dim, n_classes=4, seed=0)
X, y = X.to(info.device), y.to(info.device)
accum = 2
for way in ("no_sync", "every micro-batch"):
    torch.manual_seed(0)
    net = DDP(MLP(S.dim, 4, hidden=S.hidden).to(info.device))
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    losses = torch.zeros(S.steps, dtype=torch.float64)                 # this rank's loss of every step
    for step in range(S.steps):
        idx = (torch.arange(S.global_batch, device=info.device) + step * S.global_batch) % S.n_train
        micro = [(X[mb], y[mb]) for mb in idx[info.rank::info.world_size].chunk(accum)]
        if way == "no_sync":
            losses[step] = dp.accumulate_step(net, micro, opt, F.cross_entropy)
        else:
            opt.zero_grad()
            for xb, yb in micro:
                part = F.cross_entropy(net(xb), yb) / accum
                part.backward()
                losses[step] += part.item()
            opt.step()
        if step + 1 == exp.FIRST_STEPS:
            params_first = exp._flat_params(net)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, losses.numpy(), op=MPI.SUM)   # equal shares: the global batch's loss
    run = dict(params_first=params_first, params=exp._flat_params(net), losses=(losses / info.world_size).tolist())
    claims[f"06 {way}"] = agrees(ref, run)
    figures[f"06 {way}"] = float(np.abs(run["params"] - ref["params"]).max())

verdicts = MPI.COMM_WORLD.gather(claims, root=0)
dist.shutdown()
if info.rank == 0:
    print(repr({"claims": {k: all(v[k] for v in verdicts) for k in claims}, "figures": figures}))
