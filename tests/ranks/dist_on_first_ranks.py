"""test_dist: dist.on_first_ranks with an MPI function (comm=) then a torch one (group=) on the first 2 of 3
ranks; rank 0 prints what each rank got."""
from ddlcourse import dist
def mpi_sum(x, comm=None): return comm.allreduce(x)
def torch_sum(x, group=None):
    import torch, torch.distributed as t
    y = torch.tensor([float(x)]); t.all_reduce(y, group=group); return y.item()
a = dist.on_first_ranks(2, mpi_sum, dist.rank() + 1)
b = dist.on_first_ranks(2, torch_sum, dist.rank() + 1)
from mpi4py import MPI
res = MPI.COMM_WORLD.gather((a, b), root=0)
dist.shutdown()
if dist.rank() == 0: print(res)
