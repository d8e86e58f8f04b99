"""test_case_skeleton: Horovod runs on a 2x2 mesh but refuses to wrap a model split over ranks; rank 0 prints
what each rank was told."""
import torch
from ddlcourse import dist, training
from ddlcourse.cases import topology
cfg = topology.Config.make("smoke", backend="horovod")
ctx = training.setup(cfg, mesh=(2, 2))
assert ctx.mp == 2 and ctx.backend == "horovod"
m = torch.nn.Linear(2, 2)
try:
    ctx.wrap(m, torch.optim.SGD(m.parameters(), lr=0.1))
    said = "wrapped"
except training.ConfigError as e:
    said = f"refused: {e}"
said = ctx.comm.gather(said, root=0)
if ctx.rank == 0:
    print("\n".join(said))
dist.shutdown()
