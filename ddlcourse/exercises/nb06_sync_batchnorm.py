"""Exercises of notebooks/06_sync_batchnorm.ipynb."""
import math

import numpy as np

from ddlcourse.selfcheck import code_exercise, diagnose, exercise


@exercise("bn_values_per_stat", "a 2D batch norm averages over the batch and both spatial dimensions; "
          "SyncBatchNorm over all ranks' batches")
def bn_values_per_stat(micro_batch: int, height: int, width: int, world_size: int) -> int:
    return micro_batch * height * width * world_size


@exercise("syncbn_floats_per_layer", "forward: [count, C sums], then C squared deviations; backward: "
          "sum(dy) and sum(dy*xhat), C each")
def syncbn_floats_per_layer(channels: int) -> int:
    return (channels + 1) + channels + 2 * channels


@exercise("noise_ratio", "the standard error of a mean shrinks like 1/sqrt(batch)")
def noise_ratio(small: int, large: int) -> float:
    return math.sqrt(large / small)


# --------------------------------------------------------------------------- coding exercise: the statistics allreduce
def _stats_variant(kind: str):
    """Typical wrong ways to get the global (mean, biased var, count) per channel; they communicate as well."""
    import torch

    def stats(x, allreduce):
        dims = [0] + list(range(2, x.dim()))
        C = x.shape[1]
        m = x.numel() // C
        n = allreduce(torch.ones(1, dtype=x.dtype))[0]                       # the number of ranks
        if kind == "mean_of_means":                                          # per-rank means, averaged
            mean = allreduce(x.mean(dims)) / n
            count = allreduce(torch.tensor([float(m)], dtype=x.dtype))[0]
            var = allreduce(((x - mean.view(1, -1, *[1] * (x.dim() - 2))) ** 2).sum(dims)) / count
            return mean, var, count
        count = allreduce(torch.tensor([float(m if kind != "samples_only" else x.shape[0])], dtype=x.dtype))[0]
        mean = allreduce(x.sum(dims)) / count
        if kind == "avg_var":                                                # per-rank variances, averaged
            return mean, allreduce(x.var(dims, unbiased=False)) / n, count
        sq = allreduce(((x - mean.view(1, -1, *[1] * (x.dim() - 2))) ** 2).sum(dims))
        return mean, sq / (count - 1 if kind == "unbiased" else count), count
    return stats


@code_exercise("syncbn_stats", distributed=True)
def check_syncbn_stats(fn, **_):
    """On every rank: ``fn(x, allreduce) -> (mean, var, count)`` per channel over the samples of all ranks, against
    ``syncbn.global_batch_stats``. Rank r holds 2 + r images (unequal shares on purpose); ``allreduce(t)`` sums
    the tensor ``t`` in place over the ranks and returns it."""
    import torch

    from ddlcourse import dist
    from ddlcourse.parallel import syncbn

    dist.init(horovod=False)
    r = dist.rank()
    g = torch.Generator().manual_seed(100 + r)
    x = torch.randn(2 + r, 3, 4, 4, generator=g, dtype=torch.float64) * (1 + r) + r   # (m_r, C, H, W)

    def allreduce(t):
        return syncbn._allreduce_(t, None)

    def flat(f):
        mean, var, count = f(x.clone(), allreduce)
        return np.concatenate([np.asarray(torch.as_tensor(mean).detach(), dtype=float).reshape(-1),
                               np.asarray(torch.as_tensor(var).detach(), dtype=float).reshape(-1),
                               np.asarray(torch.as_tensor(count).detach(), dtype=float).reshape(-1)])

    ref = flat(lambda x, _ar: syncbn.global_batch_stats(x))               # the package's, over the world
    mistakes = {
        "you averaged the ranks' variances: with unequal shares (and different means per rank) that is not the "
        "variance of the global batch. All-reduce the sums of squared deviations from the *global* mean, "
        "then divide by the global count": flat(_stats_variant("avg_var")),
        "you averaged the ranks' means: a rank with fewer samples then weighs more. All-reduce the count and the "
        "per-channel sums, then divide": flat(_stats_variant("mean_of_means")),
        "batch norm normalises with the biased variance: divide the sum of squares by M, not M - 1":
            flat(_stats_variant("unbiased")),
        "your count is the number of images: each channel's statistics run over images x height x width values":
            flat(_stats_variant("samples_only")),
    }
    return diagnose(flat(fn), ref, mistakes, rtol=1e-9, atol=1e-10,
                    what=f"rank {r}'s [mean (C), var (C), count]")
