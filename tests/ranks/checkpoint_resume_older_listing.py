"""test_checkpoint_resume: a run's Checkpointer on 2 ranks, where rank 1 is shown an older listing of the folder.

Rank 0 writes epochs 1 and 2 of a small model; rank 1 is then shown the folder without epoch 2, as an NFS client
shows a directory listing it cached 30-60 s earlier. Rank 0 prints, as JSON and one entry per rank: the newest
epoch the rank's own listing shows, the epoch ``load`` resumed from, its ``extra``, whether the rank then
holds rank 0's weights, and whether it raised CheckpointError when rank 1 alone could not read the chosen file
(a rank that cannot load must stop every rank: the others would wait for it in their first collective)."""
import json
import sys
from pathlib import Path

import torch
from mpi4py import MPI

from ddlcourse import training
from ddlcourse.training import checkpoint
from ddlcourse.training.context import RunContext

folder = Path(sys.argv[1])
world = MPI.COMM_WORLD
rank = world.Get_rank()
ctx = RunContext(rank=rank, world_size=world.Get_size(), device=torch.device("cpu"), backend="allreduce", comm=world)
ck = training.Checkpointer(folder, ctx)
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
for epoch in (1, 2):
    with torch.no_grad():
        model.weight.add_(1.0)
    ck.save(epoch, model, note=f"after epoch {epoch}")
if rank == 1:                                                         # this rank's cached listing: before epoch 2
    glob = Path.glob
    Path.glob = lambda self, pattern: [p for p in glob(self, pattern) if p.name != "epoch-0002.pt"]
own = max(int(p.stem.split("-")[1]) for p in folder.glob("epoch-*.pt"))

fresh = torch.nn.Linear(3, 2)
done, extra = ck.load(fresh)
weights = torch.cat([fresh.weight.detach().flatten(), fresh.bias.detach().flatten()])
same = bool(torch.equal(weights, world.bcast(weights, root=0)))

if rank == 1:                                                         # this rank's copy of the file is unreadable
    def unreadable(path, *args, **kwargs):
        raise checkpoint.CheckpointError(f"{path} is unreadable")
    checkpoint.load_into = unreadable
try:
    ck.load(torch.nn.Linear(3, 2))
    raised = False
except training.CheckpointError:
    raised = True
out = {"own": world.gather(own), "loaded": world.gather(done), "extra": world.gather(extra),
       "same_weights": world.gather(same), "raised": world.gather(raised)}
if rank == 0:
    print(json.dumps(out))
