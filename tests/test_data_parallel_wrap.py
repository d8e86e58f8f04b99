"""All three data-parallel backends give the serial result on the same global batch."""
import pytest

pytestmark = pytest.mark.mpi

CODE = r"""
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
"""


def test_three_backends_match_serial(mpi):
    worst = float(mpi(2, CODE).stdout.strip())
    assert worst < 1e-5, worst


def test_bad_backend():
    import torch
    from ddlcourse.parallel.data_parallel import wrap
    m = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="unknown data-parallel backend"):
        wrap(m, torch.optim.SGD(m.parameters(), lr=1), backend="nccl")
