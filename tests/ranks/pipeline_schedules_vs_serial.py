"""test_pipeline_schedules: every torch.distributed.pipelining schedule named in sys.argv[1] (JSON) against the
serial model, and what GPipe, 1F1B and Interleaved1F1B hold and time; rank 0 prints RESULT and a Python literal."""
import json
import sys

import torch
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import pipeline_schedules as S_exp
torch.set_num_threads(1)
dist.init()
n = dist.world_size()
worst, losses = {}, {}
for name in json.loads(sys.argv[1]):
    r = S_exp.compare_with_serial(name, num_micro_batches=2 * n, micro_batch=3, dim=12, layers_per_rank=2)
    rs = MPI.COMM_WORLD.gather(r, root=0)
    if dist.rank() == 0:
        worst[name] = max(max(d["grad_diff"], d["loss_diff"]) for d in rs)
        losses[name] = sorted(d["n_losses"] for d in rs)
m = S_exp.measure("GPipe", num_micro_batches=4, micro_batch=2, dim=16, layers_per_rank=2, repeats=1)
f = S_exp.measure("1F1B", num_micro_batches=4, micro_batch=2, dim=16, layers_per_rank=2, repeats=1)
i = S_exp.measure("Interleaved1F1B", num_micro_batches=2 * n, micro_batch=2, dim=16, layers_per_rank=2, repeats=1)
held = MPI.COMM_WORLD.gather((m["held"], f["held"], m["busy"] > 0, len(m["events"]), i["held"]), root=0)
if dist.rank() == 0:
    print("RESULT", repr((worst, losses, held)))
dist.shutdown()
