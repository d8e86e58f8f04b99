"""test_ps_traffic: the bytes the parameter server and the ring count on their messages, and local SGD's bytes
per step with H = 1 and 3; rank 0 prints them (a Python literal)."""
from mpi4py import MPI
from ddlcourse.experiments import param_server as ps_exp
c = MPI.COMM_WORLD
tr = c.gather(ps_exp.traffic(1000, n_servers=1, steps=2), root=0)
kw = dict(steps=6, global_batch=24, lr=0.5, n_train=48, dim=4, hidden=8)
l1 = ps_exp.train_local_sgd(1, **kw)
l3 = ps_exp.train_local_sgd(3, **kw)
n_params = l1["params"].size
if c.rank == 0:
    print(repr((tr, n_params, l1["bytes_per_step"], l3["bytes_per_step"])))
