"""test_data_parallel_wrap: the allreduce, DDP and Horovod backends of wrap() against the serial run on the same
global batch; rank 0 prints the largest difference."""
import torch
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.models.small import MLP
from ddlcourse.parallel.data_parallel import wrap, unwrap

info = dist.init()
X, y = teacher_classification(64, dim=8, n_classes=3, seed=1)
n, r = info.world_size, info.rank

def run(backend, world):
    torch.manual_seed(0)
    model = MLP(8, 3, hidden=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if world > 1:
        model, opt = wrap(model, opt, backend)
    for step in range(4):
        idx = torch.arange(step * 16, step * 16 + 16)        # global batch 16
        if world > 1:
            idx = idx[r::world]                              # this rank's equal share
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad(); loss.backward(); opt.step()
    return torch.cat([p.detach().flatten() for p in unwrap(model).parameters()])

serial = run("none", 1)
diffs = {b: (run(b, n) - serial).abs().max().item() for b in ("allreduce", "ddp", "horovod")}
allr = MPI.COMM_WORLD.gather(diffs, root=0)
dist.shutdown()
if r == 0:
    print(max(max(d.values()) for d in allr))
