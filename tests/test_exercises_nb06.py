"""The coding exercise of notebook 06 (SyncBatchNorm): the statistics allreduce, on real ranks."""

CODE = """
import torch
from ddlcourse.exercises import nb06_sync_batchnorm as ex
from ddlcourse.parallel import syncbn
v = run_checker("syncbn_stats", lambda x, allreduce: syncbn.global_batch_stats(x))
assert v.ok, v.message
def mine(x, allreduce):                       # one count and C sums, then C sums of squares
    C = x.shape[1]
    s = torch.cat([torch.tensor([x.numel() / C], dtype=x.dtype), x.sum((0, 2, 3))])
    allreduce(s)
    mean = s[1:] / s[0]
    var = allreduce(((x - mean.view(1, C, 1, 1)) ** 2).sum((0, 2, 3))) / s[0]
    return mean, var, s[0]
assert run_checker("syncbn_stats", mine).ok
for kind, hint in [("avg_var", "averaged the ranks' variances"), ("mean_of_means", "averaged the ranks' means"),
                   ("unbiased", "biased variance"), ("samples_only", "images x height x width")]:
    reject("syncbn_stats", ex._stats_variant(kind), hint)
"""


def test_syncbn_stats_checker_on_ranks(on_ranks):
    on_ranks(2, CODE)
