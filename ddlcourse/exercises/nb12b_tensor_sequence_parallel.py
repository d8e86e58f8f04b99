"""Exercises of notebooks/12b_tensor_sequence_parallel.ipynb."""
import numpy as np

from ddlcourse.selfcheck import Verdict, code_exercise, diagnose


def _inputs(r, t):
    """This rank's partial output of a row-parallel layer: (batch, seq, dim)."""
    import torch

    g = torch.Generator().manual_seed(40 + r)
    n = 2 * t
    return torch.randn(n, n, 3, generator=g, dtype=torch.float64)


def _gathered(x):
    """Every rank's ``x`` (collective), in rank order."""
    import torch
    import torch.distributed as tdist

    parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, x.contiguous())
    return parts


# typical mistakes (each returns what that wrong code would give on this rank)
def _no_sum(x, group=None):
    import torch.distributed as tdist
    return x.chunk(tdist.get_world_size(group), 1)[tdist.get_rank(group)]


def _wrong_dim(x, group=None):
    import torch.distributed as tdist
    total = sum(_gathered(x))
    return total.chunk(tdist.get_world_size(group), 0)[tdist.get_rank(group)]


def _mean(x, group=None):
    import torch.distributed as tdist
    t = tdist.get_world_size(group)
    return (sum(_gathered(x)) / t).chunk(t, 1)[tdist.get_rank(group)]


def _wrong_chunk(x, group=None):
    import torch.distributed as tdist
    t, r = tdist.get_world_size(group), tdist.get_rank(group)
    return sum(_gathered(x)).chunk(t, 1)[(r + 1) % t]


@code_exercise("sp_reduce_scatter", distributed=True)
def check_reduce_scatter(fn, **_):
    """On every rank: ``fn(partial, group) -> this rank's slice, along the sequence (dim 1), of the sum of every
    rank's ``partial``, against :func:`ddlcourse.parallel.sequence.reduce_scatter_seq`."""
    from ddlcourse import dist
    from ddlcourse.parallel import sequence

    dist.init(horovod=False)
    r, t = dist.rank(), dist.world_size()
    x = _inputs(r, t)
    ref = np.asarray(sequence.reduce_scatter_seq(x.clone(), None))
    ans = fn(x.clone(), None)
    ans = np.asarray(ans.detach() if hasattr(ans, "detach") else ans, dtype=float)
    # every rank computes every wrong variant (they are collectives) before any verdict
    wrong_dim = np.asarray(_wrong_dim(x.clone()))
    mistakes = {
        "you sliced without summing: the row layer's outputs are partial sums, reduce them over the ranks first":
            np.asarray(_no_sum(x.clone())),
        "you averaged the partial outputs: a row-parallel layer's partials add up to the output, sum them":
            np.asarray(_mean(x.clone())),
        "you kept another rank's slice: rank r keeps chunk r of the sequence": np.asarray(_wrong_chunk(x.clone())),
    }
    if ans.shape == tuple(x.shape) and t > 1:
        return Verdict(False, "you returned the whole sum (an all-reduce): keep only this rank's slice of the "
                              "sequence, chunk `rank` of dim 1 -- that is what sequence parallelism saves")
    if ans.shape == wrong_dim.shape != ref.shape and np.allclose(ans, wrong_dim):
        return Verdict(False, "you split along the batch (dim 0): sequence parallelism splits the sequence, dim 1")
    return diagnose(ans, np.asarray(ref), mistakes,
                    what="this rank's slice of the summed output")
