"""test_elastic: a rank shown an older listing of the checkpoint folder still resumes from the step rank 0 chose.

Two ranks train 8 steps with a checkpoint every 4; rank 1 is then shown the folder without step 8, as an NFS
client shows a directory listing it cached 30-60 s earlier. Rank 0 prints, as JSON and one entry per rank: the
step the rank's own listing gives, the step ``load_latest`` resumed from, whether the rank then holds rank 0's
parameters and momentum, and where a second attempt of ``train_loop`` resumed (run only when the ranks agreed:
ranks that resume from different steps would hang in DDP's collectives)."""
import json
import os
import sys

import numpy as np
import torch
from mpi4py import MPI

from ddlcourse import dist, elastic

directory = sys.argv[1]
dist.init()
world = MPI.COMM_WORLD
rank = world.Get_rank()
elastic.train_loop(directory, steps=8, every=4, hidden=8)            # rank 0 writes step_4 and step_8
if rank == 1:                                                         # this rank's cached listing: before step 8
    listdir = os.listdir
    os.listdir = lambda path: [name for name in listdir(path) if name != elastic.checkpoint_name(8)]
own = elastic.resume_step(os.listdir(directory))

model = elastic.make_model(hidden=8, seed=rank + 1)                   # different on each rank until it loads
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loaded = elastic.load_latest(directory, model, opt, device="cpu")
state = np.concatenate([t.detach().flatten().numpy() for t in model.parameters()]
                       + [s["momentum_buffer"].flatten().numpy() for s in opt.state.values()])
same = bool(np.array_equal(state, world.bcast(state, root=0)))

loaded_all = world.allgather(loaded)
resumed = None
if len(set(loaded_all)) == 1:
    resumed = elastic.train_loop(directory, steps=12, every=4, hidden=8, attempt=1)["resumed_from"]
out = {"own": world.gather(own), "loaded": loaded_all, "same_state": world.gather(same),
       "resumed": world.gather(resumed)}
if rank == 0:
    print(json.dumps(out))
dist.shutdown()
