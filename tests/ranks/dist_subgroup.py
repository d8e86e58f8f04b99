"""test_dist: dist.subgroup(k) for k = 1, 2, 3: the last k ranks reduce over an MPI communicator and a torch group;
rank 0 prints the sizes each rank took part in."""
from ddlcourse import dist
import torch, torch.distributed as t
info = dist.init()
out = []
for k in (1, 2, 3):
    comm, g = dist.subgroup(k)
    if comm is not None:
        x = torch.tensor([float(info.rank + 1)]); t.all_reduce(x, group=g)
        assert comm.Get_size() == k and comm.allreduce(info.rank + 1) == x.item() == k * (k + 1) / 2
        out.append(k)
from mpi4py import MPI
res = MPI.COMM_WORLD.gather(out, root=0)
dist.shutdown()
if info.rank == 0: print(res)
