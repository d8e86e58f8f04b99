"""test_tensor_parallel: column/row-parallel linear layers against the serial MLP, forward and backward; rank 0
prints WORST and the largest difference."""
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import tensor as tensor_exp
dist.init()
d = tensor_exp.compare_with_serial(batch=6, dim=12, hidden=32)
worst = MPI.COMM_WORLD.allreduce(max(d.values()), op=MPI.MAX)
if dist.rank() == 0:
    print("WORST", worst)
dist.shutdown()
