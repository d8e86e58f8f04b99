"""test_dist: Horovod added to a run that started torch-only; rank 0 prints a Horovod sum of ones."""
from ddlcourse import dist
a = dist.init(); assert not a.horovod
b = dist.init(horovod=True); assert b.horovod and b.rank == a.rank
import horovod.torch as hvd, torch
s = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
dist.shutdown()
if b.rank == 0: print(s)
