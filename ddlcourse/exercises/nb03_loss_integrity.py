"""Exercises of notebooks/03_loss_integrity.ipynb."""
import math

import numpy as np
import torch
import torch.distributed as tdist

from ddlcourse import dist, losses
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose, exercise


@exercise("sum_grads_effective_lr", "summing N equal-sized gradient means gives N times the mean: the step is N times larger")
def sum_grads_effective_lr(lr: float, world_size: int) -> float:
    return lr * world_size


@exercise("sampler_padding_duplicates", "DistributedSampler pads the epoch up to the next multiple of world_size")
def sampler_padding_duplicates(n: int, world_size: int) -> int:
    return math.ceil(n / world_size) * world_size - n


@exercise("naive_loss", "each rank's mean counts equally, whatever the number of samples behind it")
def naive_loss(rank_sums: tuple, rank_counts: tuple) -> float:
    return sum(s / c for s, c in zip(rank_sums, rank_counts)) / len(rank_counts)


# --------------------------------------------------------------------------- coding exercise: global_mean_loss
def _mean_of_means(per_sample, global_count, world_size):
    """Mistake: each rank's own mean (right only when every rank holds the same number of samples)."""
    return per_sample.mean()


def _no_world_size(per_sample, global_count, world_size):
    """Mistake: divides by the global count but forgets that the gradients are then *averaged* over the ranks."""
    return per_sample.sum() / global_count


def _plain_sum(per_sample, global_count, world_size):
    """Mistake: the rank's sum, never divided."""
    return per_sample.sum()


def _local_count(per_sample, global_count, world_size):
    """Mistake: scales by world_size but divides by the rank's own count."""
    return per_sample.sum() * world_size / len(per_sample)


def global_mean_loss(per_sample, global_count, world_size):
    """The reference a learner would write (``losses.global_mean_loss`` also checks its arguments)."""
    return world_size * per_sample.sum() / global_count


@code_exercise("global_mean_loss", solution=global_mean_loss,
               mistakes=[(_mean_of_means, "own mean"), (_no_world_size, "factor world_size"),
                         (_plain_sum, "returned the rank's sum"), (_local_count, "rank's own count")])
def check_global_mean_loss(fn, **_):
    """Uneven shares (5, 3, 2, 1 samples on 4 ranks): each rank's value of ``fn`` must equal
    ``losses.global_mean_loss``; their mean over the ranks is then the serial mean loss."""
    import torch

    g = torch.Generator().manual_seed(3)
    sizes = (5, 3, 2, 1)
    shares = [torch.rand(m, generator=g, dtype=torch.float64) * 3 for m in sizes]   # (m_r,) per-sample losses
    M, k = sum(sizes), len(sizes)

    def per_rank(f):
        return [float(f(s.clone(), M, k)) for s in shares]

    mistakes = {
        "you took each rank's own mean: a rank with fewer samples then weighs more. Divide the rank's *sum* "
        "by the global count M": per_rank(_mean_of_means),
        "you divided by M but forgot the factor world_size: the gradients are averaged over the N ranks "
        "afterwards, so each rank must return N * sum / M": per_rank(_no_world_size),
        "you returned the rank's sum: divide it by the global count M (and multiply by world_size)":
            per_rank(_plain_sum),
        "you divided by the rank's own count len(per_sample): divide by the global count M": per_rank(_local_count),
    }
    return diagnose(per_rank(fn), per_rank(losses.global_mean_loss), mistakes, rtol=1e-10, atol=1e-12,
                    what="the per-rank losses")


# --------------------------------------------------------------------------- build it: the global-mean gradient
def global_mean_grad(model, x, y, loss_fn, group=None):
    """The reference a learner would write: leave in every ``p.grad`` the gradient of the serial mean loss over all
    ranks' samples (shares of any size), and return that loss."""
    per_sample = loss_fn(model(x), y)                                       # (m_r,) this rank's losses
    stats = torch.stack([per_sample.sum().detach(),
                         torch.tensor(float(len(y)), dtype=per_sample.dtype, device=per_sample.device)])
    tdist.all_reduce(stats, group=group)                                    # [sum of all losses, global count M]
    total, count = stats[0], stats[1]
    model.zero_grad()
    per_sample.sum().backward()                                             # the gradient of this rank's SUM
    for p in model.parameters():
        if p.grad is not None:
            tdist.all_reduce(p.grad, group=group)                           # summed over the ranks ...
            p.grad /= count                                                 # ... divided by the global count
    return float(total / count)


def _grad_variant(mean_of_means=False, local_count=False, divide=True, reduce_grads=True, zero=True):
    """``global_mean_grad`` with one typical mistake."""
    def fn(model, x, y, loss_fn, group=None):
        per_sample = loss_fn(model(x), y)
        stats = torch.stack([per_sample.sum().detach(), torch.tensor(float(len(y)), dtype=per_sample.dtype)])
        tdist.all_reduce(stats, group=group)
        if zero:
            model.zero_grad()
        (per_sample.mean() if mean_of_means else per_sample.sum()).backward()
        n = tdist.get_world_size(group)
        for p in model.parameters():
            if reduce_grads:
                tdist.all_reduce(p.grad, group=group)
            if mean_of_means:
                p.grad /= n
            elif local_count:
                p.grad /= len(y)
            elif divide:
                p.grad /= stats[1]
        return float(stats[0] / stats[1])
    return fn


_grad_mean_of_means = _grad_variant(mean_of_means=True)
_grad_local_count = _grad_variant(local_count=True)
_grad_not_divided = _grad_variant(divide=False)
_grad_not_reduced = _grad_variant(reduce_grads=False)
_grad_no_zero = _grad_variant(zero=False)

GRAD_MISTAKES = {
    "mean of per-rank means: each rank took the mean of its own losses and the ranks were averaged, so a sample on "
    "a smaller share weighs more. Back-propagate the rank's SUM and divide the summed gradient by the global count":
        _grad_mean_of_means,
    "you divided by this rank's own count len(y): the count must be all-reduced too, and every rank divides by the "
    "global count M": _grad_local_count,
    "the gradients are summed over the ranks but never divided by the global count M": _grad_not_divided,
    "the gradients were not all-reduced: each rank holds only its own share of the sum (all_reduce every p.grad)":
        _grad_not_reduced,
    "the gradients accumulate over calls: a second call adds to the first one's .grad. Zero them first "
    "(model.zero_grad())": _grad_no_zero,
}


def _grad_problem(rank: int, world: int, step: int):
    """The global batch of one step (the same on every rank) and this rank's uneven share of it: m_r = 2r + 2."""
    sizes = [2 * q + 2 for q in range(world)]
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(sum(sizes), 5, generator=g, dtype=torch.float64)      # (M, 5)
    y = torch.randint(0, 3, (sum(sizes),), generator=g)                   # (M,)
    a = sum(sizes[:rank])
    return x, y, x[a:a + sizes[rank]], y[a:a + sizes[rank]]


def _grad_model():
    torch.manual_seed(0)                                                  # the same weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(torch.float64)


def _per_sample_ce(out, y):
    return torch.nn.functional.cross_entropy(out, y, reduction="none")


def _grad_run(fn, rank: int, world: int, device) -> np.ndarray:
    """Two calls in a row (two steps' batches, no optimizer step between): the gradients and the loss of the second."""
    model = _grad_model().to(device)
    for step in range(2):
        _, _, x, y = _grad_problem(rank, world, step)
        loss = fn(model, x.to(device), y.to(device), _per_sample_ce, None)
    grads = [p.grad.detach().cpu().reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=torch.float64)
             for p in model.parameters()]
    return np.concatenate([torch.cat(grads).numpy(), [float(loss)]])



@code_exercise("global_mean_grad", distributed=True, solution=global_mean_grad, ranks=(2, 3),
               mistakes=[(_grad_mean_of_means, "mean of per-rank means"), (_grad_local_count, "own count"),
                         (_grad_not_divided, "never divided"), (_grad_not_reduced, "not all-reduced"),
                         (_grad_no_zero, "accumulate")])
def check_global_mean_grad(fn, **_):
    """On every rank (shares of 2, 4, 6, ... samples): after ``fn`` every p.grad must be the serial full-batch
    gradient of the mean loss and the returned value the serial mean loss. The ranks agree on one verdict."""
    info = dist.init(horovod=False)
    r, n = info.rank, info.world_size
    x, y, _, _ = _grad_problem(r, n, 1)
    serial = _grad_model()
    loss = _per_sample_ce(serial(x), y).mean()
    loss.backward()
    ref = np.concatenate([torch.cat([p.grad.reshape(-1) for p in serial.parameters()]).numpy(), [loss.item()]])
    wrong = {hint: _grad_run(f, r, n, info.device) for hint, f in GRAD_MISTAKES.items()} if n > 1 else {}
    mine = _grad_run(fn, r, n, info.device)
    v = diagnose(mine, ref, wrong, rtol=1e-9, atol=1e-12, what=f"rank {r}'s gradients")
    if not v.ok and np.allclose(mine[:-1], ref[:-1], rtol=1e-9, atol=1e-12):
        v = Verdict(False, f"the gradients are right, but you returned the loss {mine[-1]:.6g}; the serial mean loss "
                           f"is {ref[-1]:.6g}: return the sum of all ranks' losses over the global count")
    return agreed(v)
