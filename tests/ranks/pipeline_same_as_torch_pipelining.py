"""test_pipeline: our GPipe step and torch.distributed.pipelining's give the same gradients; rank 0 prints DIFF and
the largest difference."""
from torch import nn
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.parallel import pipeline, model_parallel as mp
from ddlcourse.experiments import model_parallel as mp_exp
from ddlcourse.data.toy import teacher_classification
dist.init()
s, p = dist.rank(), dist.world_size()
X, Y = teacher_classification(16, dim=16, n_classes=4, seed=0)
loss_fn = nn.CrossEntropyLoss()
a = mp.stage_module(mp_exp.demo_model(0, n_layers=4), s, p)
b = mp.stage_module(mp_exp.demo_model(0, n_layers=4), s, p)
pipeline.run(a, list(X.chunk(4)), list(Y.chunk(4)), loss_fn, "gpipe")
pipeline.torch_pipelining_step(b, X, Y, loss_fn, 4, "gpipe")
d = max((u.grad - v.grad).abs().max().item() for u, v in zip(a.parameters(), b.parameters()))
d = MPI.COMM_WORLD.allreduce(d, op=MPI.MAX)
if s == 0:
    print("DIFF", d)
dist.shutdown()
