"""Checkers of notebooks/11_sync_batchnorm.ipynb: the reference answers of its questions, and the checkers of the
global batch statistics and of the SyncBatchNorm function (forward and backward) the learner builds."""
import math

import numpy as np
import torch

from ddlcourse import dist
from ddlcourse.exercises.solutions.sync_batchnorm import SBN_VARIANTS, STATS_VARIANTS
from ddlcourse.parallel import syncbn
# the learner's MySyncBatchNorm, defined in the notebook, reaches the engines by value (see checkers/data_parallel)
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
STATS_HINTS = {
    "avg_var": "you averaged the ranks' variances: with unequal shares (and different means per rank) that is not "
               "the variance of the global batch. All-reduce the sums of squared deviations from the *global* mean, "
               "then divide by the global count",
    "mean_of_means": "you averaged the ranks' means: a rank with fewer samples then weighs more. All-reduce the "
                     "count and the per-channel sums, then divide",
    "unbiased": "batch norm normalises with the biased variance: divide the sum of squares by M, not M - 1",
    "samples_only": "your count is the number of images: each channel's statistics run over images x height x "
                    "width values",
}


@code_exercise("syncbn_stats", distributed=True, ranks=(2, 3))
def check_syncbn_stats(fn, **_):
    """On every rank: ``fn(x, allreduce) -> (mean, var, count)`` per channel over the samples of all ranks, against
    ``syncbn.global_batch_stats``. Rank r holds 2 + r images (unequal shares on purpose); ``allreduce(t)`` sums
    the tensor ``t`` in place over the ranks and returns it."""
    import torch

    dist.init()
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
    mistakes = {hint: flat(STATS_VARIANTS[kind]) for kind, hint in STATS_HINTS.items()}
    return diagnose(flat(fn), ref, mistakes, rtol=1e-9, atol=1e-10,
                    what=f"rank {r}'s [mean (C), var (C), count]")


# --------------------------------------------------------------------------- build it: SyncBatchNorm (forward, backward)
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


@code_exercise("syncbn_function", distributed=True, ranks=(2, 3))
def check_syncbn_function(fn, **_):
    """On every rank: ``fn.apply(x, weight, bias, eps, allreduce)`` on this rank's 2 + r images, then backward with
    an upstream gradient dy. Its output and input gradient must be this rank's rows of full-batch
    ``F.batch_norm`` on the images of all ranks, and the sums over the ranks of its weight and bias gradients
    the full-batch ones."""
    import torch.nn.functional as F

    dist.init()
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
    variants = {kind: run(SBN_VARIANTS[kind]) for kind in
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
