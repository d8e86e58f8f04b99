"""Exercises of notebooks/11_sync_batchnorm.ipynb."""
import math

import numpy as np
import torch

from ddlcourse import dist
from ddlcourse.parallel import syncbn
# the learner's MySyncBatchNorm, defined in the notebook, reaches the engines by value (see nb05_data_parallel)
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


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


def _global_stats_solution(x, allreduce):
    """x: (m, C, H, W) on this rank -> (mean (C,), biased var (C,), count) over the images of all ranks."""
    C = x.shape[1]
    s = torch.cat([torch.tensor([x.numel() / C], dtype=x.dtype), x.sum((0, 2, 3))])
    allreduce(s)                                              # [M, C sums] over the ranks
    count, mean = s[0], s[1:] / s[0]
    var = allreduce(((x - mean.view(1, C, 1, 1)) ** 2).sum((0, 2, 3))) / count
    return mean, var, count


@code_exercise("syncbn_stats", distributed=True, solution=_global_stats_solution, ranks=(2, 3), mistakes=[
    (_stats_variant("avg_var"), "averaged the ranks' variances"),
    (_stats_variant("mean_of_means"), "averaged the ranks' means"),
    (_stats_variant("unbiased"), "biased variance"),
    (_stats_variant("samples_only"), "images x height x width")])
def check_syncbn_stats(fn, **_):
    """On every rank: ``fn(x, allreduce) -> (mean, var, count)`` per channel over the samples of all ranks, against
    ``syncbn.global_batch_stats``. Rank r holds 2 + r images (unequal shares on purpose); ``allreduce(t)`` sums
    the tensor ``t`` in place over the ranks and returns it."""
    import torch

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


_SBN_LOCAL = "this rank's own statistics"
_SBN_UNBIASED = "biased variance"
_SBN_NO_BWD = "all-reduce the two sums in backward"
_SBN_COUNT = "this rank's count"
_SBN_GLOBAL_GRADS = "this rank's own sums"


def _sbn_batch(k: int, C: int = 3, HW: int = 4):
    """Rank k's images (2 + k of them, shifted and scaled per rank) and its upstream gradient dy."""
    g = torch.Generator().manual_seed(200 + k)
    x = torch.randn(2 + k, C, HW, HW, generator=g, dtype=torch.float64) * (1 + k) + k
    dy = torch.randn(2 + k, C, HW, HW, generator=g, dtype=torch.float64)
    return x, dy


@code_exercise("syncbn_function", distributed=True, solution=MySyncBatchNorm, ranks=(2, 3), mistakes=[
    (_sbn_variant("local_stats"), _SBN_LOCAL), (_sbn_variant("unbiased"), _SBN_UNBIASED),
    (_sbn_variant("no_backward_allreduce"), _SBN_NO_BWD), (_sbn_variant("local_count"), _SBN_COUNT),
    (_sbn_variant("global_grads"), _SBN_GLOBAL_GRADS)])
def check_syncbn_function(fn, **_):
    """On every rank: ``fn.apply(x, weight, bias, eps, allreduce)`` on this rank's 2 + r images, then backward with
    an upstream gradient dy. Its output and input gradient must be this rank's rows of full-batch
    ``F.batch_norm`` on the images of all ranks, and the sums over the ranks of its weight and bias gradients
    the full-batch ones."""
    import torch.nn.functional as F

    dist.init(horovod=False)
    r, n = dist.rank(), dist.world_size()
    C, eps = 3, 1e-5
    g = torch.Generator().manual_seed(300)
    weight0 = 1 + 0.5 * torch.randn(C, generator=g, dtype=torch.float64)
    bias0 = 0.5 * torch.randn(C, generator=g, dtype=torch.float64)
    batches = [_sbn_batch(k, C) for k in range(n)]
    x0, dy0 = batches[r]
    rows = slice(sum(len(b[0]) for b in batches[:r]), sum(len(b[0]) for b in batches[:r + 1]))

    def allreduce(t):
        return syncbn._allreduce_(t, None)

    def run(f):
        """(y, dx, weight grad summed over ranks, bias grad summed over ranks) on this rank."""
        x, w, b = x0.clone().requires_grad_(), weight0.clone().requires_grad_(), bias0.clone().requires_grad_()
        y = f.apply(x, w, b, eps, allreduce)
        (y * dy0).sum().backward()
        gw = torch.zeros(C, dtype=torch.float64) if w.grad is None else w.grad.detach().clone()
        gb = torch.zeros(C, dtype=torch.float64) if b.grad is None else b.grad.detach().clone()
        return y.detach(), x.grad, allreduce(gw.contiguous()), allreduce(gb.contiguous())

    xf = torch.cat([b[0] for b in batches]).requires_grad_()
    wf, bf = weight0.clone().requires_grad_(), bias0.clone().requires_grad_()
    yf = F.batch_norm(xf, None, None, wf, bf, training=True, eps=eps)
    (yf * torch.cat([b[1] for b in batches])).sum().backward()
    ref = (yf.detach()[rows], xf.grad[rows], wf.grad, bf.grad)

    got = run(fn)
    variants = {kind: run(_sbn_variant(kind)) for kind in
                ("local_stats", "unbiased", "local_count", "no_backward_allreduce", "global_grads")}
    if not _same_t(got[0], ref[0]):
        for kind, hint in (("local_stats", f"you normalised with {_SBN_LOCAL}: all-reduce [count, C sums, C sums "
                                           "of squares] first, so that every rank uses those of the global batch"),
                           ("unbiased", f"batch norm normalises with the {_SBN_UNBIASED} (divide by M, not M - 1)"),
                           ("local_count", f"you divided the all-reduced sums by {_SBN_COUNT}: all-reduce the "
                                           "count too, M is the number of values per channel over all ranks")):
            if _same_t(got[0], variants[kind][0]):
                return Verdict(False, hint)
        return Verdict(False, f"rank {r}'s output differs from full-batch batch norm by up to "
                              f"{_maxdiff(got[0], ref[0]):.3g}")
    if got[1] is None:
        return Verdict(False, "x got no gradient: backward must return (dx, dweight, dbias, None, None)")
    if not _same_t(got[1], ref[1]):
        if _same_t(got[1], variants["no_backward_allreduce"][1]):
            return Verdict(False, f"the output is right, but the input gradient is not: {_SBN_NO_BWD} (sum(dy) and "
                                  "sum(dy * xhat)), since they run over the global batch")
        if _same_t(got[1], variants["local_count"][1]):
            return Verdict(False, f"the input gradient divides the global sums by {_SBN_COUNT}: use the global M")
        return Verdict(False, f"rank {r}'s input gradient differs from full-batch batch norm by up to "
                              f"{_maxdiff(got[1], ref[1]):.3g}")
    if _same_t(got[2], n * ref[2]) and _same_t(got[3], n * ref[3]):
        return Verdict(False, f"the weight and bias gradients are the all-reduced sums: return {_SBN_GLOBAL_GRADS}, "
                              "like any other parameter's gradient; DDP then averages them over the ranks")
    if not (_same_t(got[2], ref[2]) and _same_t(got[3], ref[3])):
        return Verdict(False, "the weight and bias gradients, summed over the ranks, differ from full-batch batch "
                              f"norm by up to {max(_maxdiff(got[2], ref[2]), _maxdiff(got[3], ref[3])):.3g}: "
                              "dweight = sum(dy * xhat), dbias = sum(dy) over this rank's values")
    return Verdict(True)


def _same_t(a, b, tol=1e-9) -> bool:
    if a is None or b is None:
        return False
    return tuple(a.shape) == tuple(b.shape) and bool(torch.allclose(a.detach(), b.detach(), rtol=tol, atol=tol))


def _maxdiff(a, b) -> float:
    try:
        return float((a.detach() - b.detach()).abs().max())
    except (RuntimeError, AttributeError):
        return float("nan")
