"""test_pipeline: the work 1F1B emulates with 1, 4 and 6 micro-batches of one global batch (recorded instead of
slept); rank 0 prints a RANK line per rank and micro-batch count with the total and the number of waits."""
from ddlcourse import dist
from ddlcourse.parallel import pipeline, model_parallel as mp
from ddlcourse.experiments import model_parallel as mp_exp
from ddlcourse.data.toy import teacher_classification
from torch import nn
dist.init()
slept = []
pipeline._emulate = slept.append          # record the emulated work instead of sleeping
s, p = dist.rank(), dist.world_size()
X, Y = teacher_classification(24, dim=16, n_classes=4, seed=0)
said = []
for m in (1, 4, 6):
    slept.clear()
    stage = mp.stage_module(mp_exp.demo_model(0, n_layers=4), s, p)
    pipeline.run(stage, list(X.chunk(m)), list(Y.chunk(m)), nn.CrossEntropyLoss(), "1f1b",
                 delay_s=0.3, overhead_s=0.01)
    said.append(f"RANK {s} M {m} TOTAL {sum(slept):.6f} N {len(slept)}")
from mpi4py import MPI   # one print on rank 0: the ranks' own prints would interleave
everything = MPI.COMM_WORLD.gather(said, root=0)
if s == 0:
    print("\n".join(line for lines in everything for line in lines))
dist.shutdown()
