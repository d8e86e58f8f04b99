"""test_metrics: the confusion matrix, ROC AUC, average precision and global mean reduced over 3 uneven shards
equal those of the whole set, and the mean of per-rank accuracies does not; rank 0 prints True if all held."""
import numpy as np
from mpi4py import MPI
from ddlcourse import metrics
comm = MPI.COMM_WORLD; r, n = comm.Get_rank(), comm.Get_size()
g = np.random.default_rng(0)
t = g.integers(0, 4, 1000); p = np.where(g.random(1000) < 0.7, t, g.integers(0, 4, 1000))
s = g.random(1000) + t * 0.1; y = (t == 3)
cuts = [0, 100, 700, 1000]                      # deliberately uneven shards
sl = slice(cuts[r], cuts[r + 1])
dist_cm = metrics.confusion_matrix(p[sl], t[sl], 4, comm=comm)
ok = (dist_cm == metrics.confusion_matrix(p, t, 4)).all()
ok &= abs(metrics.roc_auc(s[sl], y[sl], comm) - metrics.roc_auc(s, y)) < 1e-12
ok &= abs(metrics.average_precision(s[sl], y[sl], comm) - metrics.average_precision(s, y)) < 1e-12
ok &= abs(metrics.global_mean(s[sl], comm) - s.mean()) < 1e-12
# the wrong way (mean of per-rank accuracies) differs on uneven shards
local_acc = (p[sl] == t[sl]).mean()
wrong = comm.allreduce(local_acc) / n
ok &= abs(wrong - (p == t).mean()) > 1e-4
res = comm.gather(bool(ok), root=0)
if r == 0: print(all(res))
