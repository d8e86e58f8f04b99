"""test_data_parallel: SyncBatchNorm inside DDP, each rank on its share of the batch, against full-batch BatchNorm
on one process; rank 0 prints the largest difference of the state."""
import copy, torch
from torch import nn
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.models.small import SmallCNN
from ddlcourse.parallel.data_parallel import wrap, unwrap
from ddlcourse.parallel.syncbn import convert_sync_batchnorm

info = dist.init()
r, n = info.rank, info.world_size
torch.manual_seed(0)
serial = SmallCNN(width=4)
par = convert_sync_batchnorm(copy.deepcopy(serial))
opt_s = torch.optim.SGD(serial.parameters(), lr=0.1, momentum=0.9)
opt_p = torch.optim.SGD(par.parameters(), lr=0.1, momentum=0.9)
par, opt_p = wrap(par, opt_p, "ddp")
g = torch.Generator().manual_seed(1)
for step in range(3):
    X = torch.randn(8, 1, 16, 16, generator=g); y = torch.randint(0, 3, (8,), generator=g)
    for model, opt, idx in ((serial, opt_s, slice(None)), (par, opt_p, slice(r, None, n))):
        loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad(); loss.backward(); opt.step()
sd_s, sd_p = serial.state_dict(), unwrap(par).state_dict()
worst = max((sd_s[k].float() - sd_p[k].float()).abs().max().item() for k in sd_s)
worst = MPI.COMM_WORLD.allreduce(worst, op=MPI.MAX)
dist.shutdown()
if r == 0:
    print(worst)
