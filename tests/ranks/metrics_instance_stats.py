"""test_metrics: instance-segmentation statistics of images split over the ranks, reduced, equal the serial ones;
rank 0 prints OK and AP50."""
import numpy as np
from mpi4py import MPI
from ddlcourse import metrics
rng = np.random.default_rng(0)
imgs = []
for i in range(6):                     # random true and predicted id maps with random scores
    gt = rng.integers(0, 4, (8, 8)); pred = np.where(rng.random((8, 8)) < 0.8, gt, rng.integers(0, 5, (8, 8)))
    imgs.append((pred, rng.random(int(pred.max())), gt))
comm = MPI.COMM_WORLD
serial = metrics.InstanceStats(); local = metrics.InstanceStats()
for i, (p, s, g) in enumerate(imgs):
    serial.add(p, s, g)
    if i % comm.size == comm.rank: local.add(p, s, g)
a, b = serial.result(), local.result(comm)
assert abs(a["ap50"] - b["ap50"]) < 1e-12 and abs(a["ap"] - b["ap"]) < 1e-12, (a, b)
assert abs(a["miou_matched"] - b["miou_matched"]) < 1e-12 and a["n_gt"] == b["n_gt"]
if comm.rank == 0: print("OK", a["ap50"])
