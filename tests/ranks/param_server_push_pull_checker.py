"""test_param_server: the push/pull checker on the package's push_pull, a correct solution with non-blocking sends,
two mistakes and an unwritten template; rank 0 prints every rank's verdicts (a Python literal)."""
import numpy as np
from mpi4py import MPI
from ddlcourse import selfcheck
from ddlcourse.parallel.param_server import push_pull, GRAD, PARAM
from ddlcourse.exercises.solutions import parameter_server as sol

def mine(comm, grad, params, shards):          # a correct solution with non-blocking sends
    reqs = [comm.Isend(np.ascontiguousarray(grad[a:b]), dest=s, tag=GRAD) for s, (a, b) in enumerate(shards)]
    MPI.Request.Waitall(reqs)
    for s, (a, b) in enumerate(shards):
        comm.Recv(params[a:b], source=s, tag=PARAM)
    return params

def skeleton(comm, grad, params, shards):
    raise NotImplementedError

v = [selfcheck.run_checker("ps_push_pull", f) for f in (push_pull, mine, sol._push_params, sol._no_pull, skeleton)]
allv = MPI.COMM_WORLD.gather([(x.ok, x.message) for x in v], root=0)
if MPI.COMM_WORLD.rank == 0:
    print(repr(allv))
