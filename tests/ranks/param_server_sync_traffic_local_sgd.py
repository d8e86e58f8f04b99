"""test_param_server: the synchronous PS (1 and 2 servers) against serial and allreduce, the bytes counted on
the messages, asynchronous staleness, and local SGD; rank 0 prints the results (a Python literal)."""
import numpy as np
from mpi4py import MPI
from ddlcourse.experiments import param_server as ps_exp
c = MPI.COMM_WORLD
servers = [1, 2] if c.size >= 4 else [1]
sync = {S: ps_exp.compare_sync(steps=4, lr=0.5, n_servers=S, n_train=48, dim=4, hidden=8) for S in servers}
tr = ps_exp.traffic(1000, n_servers=1, steps=2)
trs = c.gather(tr, root=0)
asy = ps_exp.train_async(steps=3, n_train=48, dim=4, hidden=8)
kw = dict(steps=6, global_batch=24, lr=0.5, n_train=48, dim=4, hidden=8)
l1 = ps_exp.train_local_sgd(1, **kw)
ar = ps_exp.train_allreduce(**kw)
l3 = ps_exp.train_local_sgd(3, **kw)
d_local = c.allreduce(float(np.abs(l1["params"] - ar["params"]).max()), op=MPI.MAX)
if c.rank == 0:
    print(repr((sync, trs, len(asy["staleness"]), min(asy["staleness"]), d_local, l1["at"], l3["at"],
                l1["bytes_per_step"], l3["bytes_per_step"])))
