"""test_sharded: the bytes each mode's collectives send per step, counted, against the formula; every rank prints
a VOL line per mode."""
from ddlcourse import dist
from ddlcourse.parallel import sharded
from ddlcourse.experiments import sharded as sharded_exp
dist.init()
for mode in sharded.MODES:
    r = sharded_exp.train(mode, steps=2, global_batch=24, dim=16, hidden=48, depth=2, count_bytes=True)
    tot = sum(r["sent"].values())
    print("VOL", dist.rank(), mode, tot, sharded.predicted_comm_bytes(mode, r["n_params"], dist.world_size()))
dist.shutdown()
