"""test_syncbn: SyncBatchNorm over unequal per-rank batches against BatchNorm on the full batch (outputs, input
gradients, summed weight gradients, running statistics), with syncbn.ALLREDUCE = sys.argv[1] ("auto" or
"torch"); rank 0 prints the largest difference and how many torch groups MPI carries."""
import copy, sys, torch
from torch import nn
import torch.distributed as tdist
from mpi4py import MPI
from ddlcourse import dist, grid
from ddlcourse.parallel import syncbn
from ddlcourse.parallel.syncbn import convert_sync_batchnorm

syncbn.ALLREDUCE = sys.argv[1]
info = dist.init()
r, n = info.rank, info.world_size
worst = 0.0
for shape, cls in [((5,), nn.BatchNorm1d), ((5, 7), nn.BatchNorm1d), ((5, 4, 3), nn.BatchNorm2d),
                   ((5, 2, 3, 3), nn.BatchNorm3d)]:
    sizes = [3 + 2 * k for k in range(n)]             # unequal per-rank batch sizes
    start = sum(sizes[:r])
    torch.manual_seed(3)
    ref = cls(5)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2.0); ref.bias.uniform_(-1, 1)
    mine = convert_sync_batchnorm(copy.deepcopy(ref))
    g = torch.Generator().manual_seed(0)
    for it in range(3):
        X = torch.randn(sum(sizes), *shape, generator=g) * 3 + 2   # the global batch, same on every rank
        R = torch.randn(sum(sizes), *shape, generator=g)
        xf = X.clone().requires_grad_()
        yf = ref(xf); (yf * R).sum().backward()                    # full batch, one process
        xl = X[start:start + sizes[r]].clone().requires_grad_()
        yl = mine(xl); (yl * R[start:start + sizes[r]]).sum().backward()
        d = [(yl - yf[start:start + sizes[r]]).abs().max(), (xl.grad - xf.grad[start:start + sizes[r]]).abs().max()]
        worst = max(worst, max(v.item() for v in d))
    gw, gb = mine.weight.grad.clone(), mine.bias.grad.clone()
    tdist.all_reduce(gw); tdist.all_reduce(gb)                    # what data parallelism adds up
    for a, b in [(gw, ref.weight.grad), (gb, ref.bias.grad), (mine.running_mean, ref.running_mean),
                 (mine.running_var, ref.running_var)]:
        worst = max(worst, (a - b).abs().max().item() / max(1.0, b.abs().max().item()))
worst = MPI.COMM_WORLD.allreduce(worst, op=MPI.MAX)
comms = sum(c is not None for c in grid._TORCH["mpi"].values())   # torch groups MPI carries (before shutdown)
dist.shutdown()
if r == 0:
    print(worst, comms)
