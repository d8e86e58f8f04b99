"""test_device_placement: experiments.mpi_hook.compare_hooks on 2 ranks whose device is not the CPU (dist.init()'s
device set to meta, where a GPU node has cuda); rank 0 prints whether the full-precision hooks trained like serial,
and whether the MPI hooks' buckets all went through MPI."""
import dataclasses

import torch

from ddlcourse import dist
from ddlcourse.experiments import mpi_hook as exp

info = dist.init()
dist._STATE["info"] = dataclasses.replace(info, device=torch.device("meta"))   # what a GPU rank's init says
out = exp.compare_hooks(steps=2, time_steps=1)
if info.rank == 0:
    print("like serial:", all(out[h]["max_diff"] < 1e-5 for h in ("default", "mpi", "mpi-overlap")))
    print("MPI hooks' buckets through MPI:", {name: h["buckets"]["mpi"] > 0 and h["buckets"]["default"] == 0
                                              for name, h in out.items() if h["buckets"]})
dist.shutdown()
