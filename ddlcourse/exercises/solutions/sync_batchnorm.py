"""Reference solutions of notebooks/11_sync_batchnorm.ipynb: the global batch statistics and MySyncBatchNorm (forward
and backward) as a learner writes them, and each with one typical mistake (what their checkers,
:mod:`ddlcourse.exercises.checkers.sync_batchnorm`, must name)."""
import torch

from ddlcourse.selfcheck import reference


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


STATS_VARIANTS = {kind: _stats_variant(kind) for kind in ("avg_var", "mean_of_means", "unbiased", "samples_only")}


@reference("syncbn_stats", mistakes=[
    (STATS_VARIANTS["avg_var"], "averaged the ranks' variances"),
    (STATS_VARIANTS["mean_of_means"], "averaged the ranks' means"),
    (STATS_VARIANTS["unbiased"], "biased variance"),
    (STATS_VARIANTS["samples_only"], "images x height x width")])
def _global_stats_solution(x, allreduce):
    """x: (m, C, H, W) on this rank -> (mean (C,), biased var (C,), count) over the images of all ranks."""
    C = x.shape[1]
    s = torch.cat([torch.tensor([x.numel() / C], dtype=x.dtype), x.sum((0, 2, 3))])
    allreduce(s)                                              # [M, C sums] over the ranks
    count, mean = s[0], s[1:] / s[0]
    var = allreduce(((x - mean.view(1, C, 1, 1)) ** 2).sum((0, 2, 3))) / count
    return mean, var, count


# --------------------------------------------------------------------------- build it: SyncBatchNorm (forward, backward)
class MySyncBatchNorm(torch.autograd.Function):
    """Batch norm over the images of all ranks, as an autograd Function with a hand-written backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, allreduce):
        C = x.shape[1]
        dims = (0, 2, 3)
        stats = torch.cat([torch.tensor([x.numel() / C], dtype=x.dtype, device=x.device),
                           x.sum(dims), (x * x).sum(dims)])
        allreduce(stats)                                      # [M, C sums, C sums of squares] over all ranks
        count = stats[0]
        mean = stats[1:C + 1] / count
        var = stats[C + 1:] / count - mean * mean             # biased, as batch norm normalises
        invstd = torch.rsqrt(var + eps)
        xhat = (x - mean.view(1, C, 1, 1)) * invstd.view(1, C, 1, 1)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.count, ctx.allreduce = count, allreduce
        return xhat * weight.view(1, C, 1, 1) + bias.view(1, C, 1, 1)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        C = dy.shape[1]
        dbias = dy.sum((0, 2, 3))                             # this rank's own: DDP averages them
        dweight = (dy * xhat).sum((0, 2, 3))
        sums = ctx.allreduce(torch.cat([dbias, dweight]))     # the two sums over the global batch
        mean_dy = (sums[:C] / ctx.count).view(1, C, 1, 1)
        mean_dy_xhat = (sums[C:] / ctx.count).view(1, C, 1, 1)
        dx = (weight * invstd).view(1, C, 1, 1) * (dy - mean_dy - xhat * mean_dy_xhat)
        return dx, dweight, dbias, None, None


def _sbn_variant(kind: str):
    """MySyncBatchNorm with one typical mistake: ``local_stats`` (no allreduce in forward), ``unbiased`` (normalises
    with the unbiased variance), ``no_backward_allreduce`` (the two sums of backward are this rank's),
    ``local_count`` (the sums are all-reduced, the count is not), ``global_grads`` (returns the all-reduced sums as
    the weight and bias gradients)."""

    class Variant(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, eps, allreduce):
            C = x.shape[1]
            dims = (0, 2, 3)
            m = torch.tensor([x.numel() / C], dtype=x.dtype, device=x.device)
            stats = torch.cat([m, x.sum(dims), (x * x).sum(dims)])
            if kind != "local_stats":
                allreduce(stats)
            count = m[0] if kind == "local_count" else stats[0]
            mean = stats[1:C + 1] / count
            var = stats[C + 1:] / count - mean * mean
            if kind == "unbiased":
                var = var * count / (count - 1)
            invstd = torch.rsqrt(var + eps)
            xhat = (x - mean.view(1, C, 1, 1)) * invstd.view(1, C, 1, 1)
            ctx.save_for_backward(xhat, weight, invstd)
            ctx.count, ctx.allreduce = count, allreduce
            return xhat * weight.view(1, C, 1, 1) + bias.view(1, C, 1, 1)

        @staticmethod
        def backward(ctx, dy):
            xhat, weight, invstd = ctx.saved_tensors
            C = dy.shape[1]
            dbias = dy.sum((0, 2, 3))
            dweight = (dy * xhat).sum((0, 2, 3))
            sums = torch.cat([dbias, dweight])
            if kind not in ("no_backward_allreduce", "local_stats"):
                ctx.allreduce(sums)
            if kind == "global_grads":
                dbias, dweight = sums[:C], sums[C:]
            mean_dy = (sums[:C] / ctx.count).view(1, C, 1, 1)
            mean_dy_xhat = (sums[C:] / ctx.count).view(1, C, 1, 1)
            dx = (weight * invstd).view(1, C, 1, 1) * (dy - mean_dy - xhat * mean_dy_xhat)
            return dx, dweight, dbias, None, None

    return Variant


SBN_VARIANTS = {kind: _sbn_variant(kind) for kind in
                ("local_stats", "unbiased", "no_backward_allreduce", "local_count", "global_grads")}

# the hint fragments are the checker's _SBN_* phrases
reference("syncbn_function", mistakes=[
    (SBN_VARIANTS["local_stats"], "this rank's own statistics"), (SBN_VARIANTS["unbiased"], "biased variance"),
    (SBN_VARIANTS["no_backward_allreduce"], "all-reduce the two sums in backward"),
    (SBN_VARIANTS["local_count"], "this rank's count"),
    (SBN_VARIANTS["global_grads"], "this rank's own sums")])(MySyncBatchNorm)
