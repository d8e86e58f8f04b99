"""test_dcp: FSDP2 over ``dp`` (``sys.argv[1]``) times tensor parallelism on a 2-D mesh against the serial run;
rank 0 prints every rank's RESULT line (world size, mesh, losses and parameters equal, its local weight shape)."""
import sys

import torch
from ddlcourse import dist, dcp
dist.init(); torch.set_num_threads(1)
n = torch.distributed.get_world_size()
ref = dcp.train_serial(5)
out = dcp.train_2d(5, dp=int(sys.argv[1]))
dl = max(abs(a - b) for a, b in zip(out["losses"], ref["losses"]))
dp_ = float((out["params"] - ref["params"]).abs().max())
line = " ".join(str(v) for v in ("RESULT", n, out["mesh"], dl < 1e-5, dp_ < 1e-5, out["local_shapes"]["0.weight"]))
from mpi4py import MPI   # one print on rank 0: the ranks' own prints would interleave
lines = MPI.COMM_WORLD.gather(line, root=0)
if MPI.COMM_WORLD.Get_rank() == 0:
    print("\n".join(lines))
