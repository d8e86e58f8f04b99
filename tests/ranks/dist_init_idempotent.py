"""test_dist: dist.init twice gives one run, consistent with torch.distributed; per-rank seeds differ, a shared
seed agrees; rank 0 prints ok<rank> of every rank."""
from ddlcourse import dist
a = dist.init(); b = dist.init(); assert a is b
import torch.distributed as t
assert t.get_rank() == a.rank and t.get_world_size() == 3 == a.world_size
assert a.backend == 'gloo' and str(a.device) == 'cpu' and a.local_rank == a.rank
s = dist.seed_everything(5); import torch; x = torch.rand(1).item()
from mpi4py import MPI; xs = MPI.COMM_WORLD.allgather(x)
assert len(set(xs)) == 3, xs  # per-rank seeds differ
dist.seed_everything(5, per_rank=False); y = MPI.COMM_WORLD.allgather(torch.rand(1).item())
assert len(set(y)) == 1, y   # a shared seed agrees
oks = MPI.COMM_WORLD.gather(f'ok{a.rank}', root=0)
dist.shutdown()
if a.rank == 0: print(' '.join(oks))
