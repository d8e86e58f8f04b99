"""Checkers of notebooks/03_loss_integrity.ipynb: its questions, each rank's share of the global-mean loss (checked
against :func:`ddlcourse.losses.global_mean_loss`) and the global-mean gradient (against a serial run)."""
import math

import numpy as np
import torch

from ddlcourse import dist, losses
from ddlcourse.exercises.solutions.loss_integrity import GRAD_VARIANTS, LOSS_VARIANTS
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose, exercise


@exercise("sum_grads_effective_lr",
          "summing N equal-sized gradient means gives N times the mean: the step is N times larger")
def sum_grads_effective_lr(lr: float, world_size: int) -> float:
    return lr * world_size


@exercise("sampler_padding_duplicates", "DistributedSampler pads the epoch up to the next multiple of world_size")
def sampler_padding_duplicates(n: int, world_size: int) -> int:
    return math.ceil(n / world_size) * world_size - n


@exercise("naive_loss", "each rank's mean counts equally, whatever the number of samples behind it")
def naive_loss(rank_sums: tuple, rank_counts: tuple) -> float:
    return sum(s / c for s, c in zip(rank_sums, rank_counts)) / len(rank_counts)


# --------------------------------------------------------------------------- coding exercise: global_mean_loss
LOSS_HINTS = {
    "mean_of_means": "you took each rank's own mean: a rank with fewer samples then weighs more. Divide the rank's "
                     "*sum* by the global count M",
    "no_world_size": "you divided by M but forgot the factor world_size: the gradients are averaged over the N ranks "
                     "afterwards, so each rank must return N * sum / M",
    "plain_sum": "you returned the rank's sum: divide it by the global count M (and multiply by world_size)",
    "local_count": "you divided by the rank's own count len(per_sample): divide by the global count M",
}


@code_exercise("global_mean_loss")
def check_global_mean_loss(fn, **_):
    """Uneven shares (5, 3, 2, 1 samples on 4 ranks): each rank's value of ``fn`` must equal
    ``losses.global_mean_loss``; their mean over the ranks is then the serial mean loss."""
    g = torch.Generator().manual_seed(3)
    sizes = (5, 3, 2, 1)
    shares = [torch.rand(m, generator=g, dtype=torch.float64) * 3 for m in sizes]   # (m_r,) per-sample losses
    M, k = sum(sizes), len(sizes)

    def per_rank(f):
        return [float(f(s.clone(), M, k)) for s in shares]

    mistakes = {hint: per_rank(LOSS_VARIANTS[kind]) for kind, hint in LOSS_HINTS.items()}
    return diagnose(per_rank(fn), per_rank(losses.global_mean_loss), mistakes, rtol=1e-10, atol=1e-12,
                    what="the per-rank losses")


# --------------------------------------------------------------------------- build it: the global-mean gradient
GRAD_HINTS = {
    "mean_of_means":
        "mean of per-rank means: each rank took the mean of its own losses and the ranks were averaged, so a sample on "
        "a smaller share weighs more. Back-propagate the rank's SUM and divide the summed gradient by the global count",
    "local_count":
        "you divided by this rank's own count len(y): the count must be all-reduced too, and every rank divides by the "
        "global count M",
    "not_divided": "the gradients are summed over the ranks but never divided by the global count M",
    "not_reduced":
        "the gradients were not all-reduced: each rank holds only its own share of the sum (all_reduce every p.grad)",
    "no_zero":
        "the gradients accumulate over calls: a second call adds to the first one's .grad. Zero them first "
        "(model.zero_grad())",
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


@code_exercise("global_mean_grad", distributed=True, ranks=(2, 3))
def check_global_mean_grad(fn, **_):
    """On every rank (shares of 2, 4, 6, ... samples): after ``fn`` every p.grad must be the serial full-batch
    gradient of the mean loss and the returned value the serial mean loss. The ranks agree on one verdict."""
    info = dist.init()
    r, n = info.rank, info.world_size
    x, y, _, _ = _grad_problem(r, n, 1)
    serial = _grad_model()
    loss = _per_sample_ce(serial(x), y).mean()
    loss.backward()
    ref = np.concatenate([torch.cat([p.grad.reshape(-1) for p in serial.parameters()]).numpy(), [loss.item()]])
    wrong = ({hint: _grad_run(GRAD_VARIANTS[kind], r, n, info.device) for kind, hint in GRAD_HINTS.items()}
             if n > 1 else {})
    mine = _grad_run(fn, r, n, info.device)
    v = diagnose(mine, ref, wrong, rtol=1e-9, atol=1e-12, what=f"rank {r}'s gradients")
    if not v.ok and np.allclose(mine[:-1], ref[:-1], rtol=1e-9, atol=1e-12):
        v = Verdict(False, f"the gradients are right, but you returned the loss {mine[-1]:.6g}; the serial mean loss "
                           f"is {ref[-1]:.6g}: return the sum of all ranks' losses over the global count")
    return agreed(v)
