"""test_data_parallel: every way of data parallelism (and fp16 compression, and a one-rank subgroup) against the
serial run, with SGD+momentum and Adam; rank 0 prints every rank's largest differences."""
import numpy as np
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments.data_parallel import train_way

dist.init()
out = {}
for opt, lr in (("sgd", 0.2), ("adam", 0.01)):
    ref = train_way("serial", steps=5, global_batch=12, optimizer=opt, lr=lr)
    for way in ("after_backward", "allreduce", "overlap", "ddp", "horovod"):
        res = train_way(way, steps=5, global_batch=12, optimizer=opt, lr=lr)
        out[(opt, way)] = max(np.abs(res["params"] - ref["params"]).max(),
                              np.abs(np.array(res["losses"]) - ref["losses"]).max())
fp16 = train_way("horovod", steps=5, global_batch=12, compression="fp16", lr=0.2)
ref = train_way("serial", steps=5, global_batch=12, lr=0.2)
out["fp16"] = np.abs(fp16["params"] - ref["params"]).max()
sub = train_way("ddp", steps=3, global_batch=12, n_ranks=1)      # a one-rank subgroup is the serial run
ref1 = train_way("serial", steps=3, global_batch=12)
out["sub1"] = None if sub is None else float(np.abs(sub["params"] - ref1["params"]).max())
allout = MPI.COMM_WORLD.gather(out, root=0)
dist.shutdown()
if dist.rank() == 0:
    print(repr(allout))
