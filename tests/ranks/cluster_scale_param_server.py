"""test_cluster_scale_claims: notebook 09's float64 comparisons with serial training at the cluster profile's ranks,
steps and learning rate; ``sys.argv[1]``: the MLP's width (only wall time depends on it). Rank 0 prints
``{claim: verdict}`` and the differences behind them."""
import sys

import numpy as np
from mpi4py import MPI

from ddlcourse import config
from ddlcourse.experiments import param_server as exp

S = config.sizes("param_server", "cluster", hidden=int(sys.argv[1]))
comm = MPI.COMM_WORLD
assert comm.Get_size() == S.n_ranks, f"run on the cluster profile's {S.n_ranks} ranks, not {comm.Get_size()}"
problem = dict(n_train=S.n_train, dim=S.dim, hidden=S.hidden)
figures = {}
for n_servers in (1, 2):                 # cell 8: synchronous PS and allreduce against serial, 1 and 2 servers
    d = exp.compare_sync(steps=S.steps, global_batch=S.global_batch, lr=S.lr, n_servers=n_servers, **problem)
    figures[f"sync PS, {n_servers} server(s)"] = d["ps_vs_serial"]
    figures[f"allreduce, {n_servers} server(s) run"] = d["allreduce_vs_serial"]
# cell 8: staleness 0 emulates synchronous SGD (one process, the whole stale_steps)
stale = exp.train_stale(0, steps=S.stale_steps, global_batch=S.global_batch, lr=S.lr, **problem)
serial = exp.train_serial(steps=S.stale_steps, global_batch=S.global_batch, lr=S.lr, **problem)
figures["staleness 0"] = float(np.abs(stale["params"] - serial["params"]).max())
# cell 8: local SGD with H = 1 equals allreduce data parallelism over local_steps
local = exp.train_local_sgd(1, steps=S.local_steps, global_batch=S.global_batch, lr=S.lr, **problem)
dp = exp.train_allreduce(steps=S.local_steps, global_batch=S.global_batch, lr=S.lr, **problem)
figures["local SGD, H = 1"] = comm.allreduce(float(np.abs(local["params"] - dp["params"]).max()), op=MPI.MAX)
if comm.Get_rank() == 0:
    print(repr({"claims": {k: v < 1e-12 for k, v in figures.items()}, "figures": figures}))
