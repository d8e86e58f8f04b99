"""test_case_skeleton: RunContext.write_result on 2 ranks writes one JSON file, from rank 0 only, converting
tensors and NumPy values; rank 0 prints WROTE and which ranks wrote."""
import numpy as np, torch
from ddlcourse import training, dist
from ddlcourse.cases import topology
ctx = training.setup(topology.Config.make("smoke", run_name="r0"))
path = ctx.write_result("demo", {"rank": ctx.rank, "t": torch.tensor([1.5, 2.0]), "a": np.arange(3),
                                 "x": np.float32(0.5), "n": {"k": np.int64(4)}})
wrote = ctx.comm.gather(path is not None, root=0)
if ctx.rank == 0:
    print("WROTE", wrote)
dist.shutdown()
