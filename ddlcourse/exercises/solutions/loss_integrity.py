"""Reference solutions of notebooks/03_loss_integrity.ipynb: each rank's share of the global-mean loss and the
global-mean gradient as a learner writes them, and each with one typical mistake (what its checkers,
:mod:`ddlcourse.exercises.checkers.loss_integrity`, must name)."""
import torch
import torch.distributed as tdist

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- each rank's share of the global-mean loss
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


LOSS_VARIANTS = {"mean_of_means": _mean_of_means, "no_world_size": _no_world_size, "plain_sum": _plain_sum,
                 "local_count": _local_count}


def global_mean_loss(per_sample, global_count, world_size):
    """The reference a learner would write (``losses.global_mean_loss`` also checks its arguments)."""
    return world_size * per_sample.sum() / global_count


reference("global_mean_loss", mistakes=[
    (_mean_of_means, "own mean"), (_no_world_size, "factor world_size"), (_plain_sum, "returned the rank's sum"),
    (_local_count, "rank's own count")])(global_mean_loss)


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

GRAD_VARIANTS = {"mean_of_means": _grad_mean_of_means, "local_count": _grad_local_count,
                 "not_divided": _grad_not_divided, "not_reduced": _grad_not_reduced, "no_zero": _grad_no_zero}

reference("global_mean_grad", mistakes=[
    (_grad_mean_of_means, "mean of per-rank means"), (_grad_local_count, "own count"),
    (_grad_not_divided, "never divided"), (_grad_not_reduced, "not all-reduced"),
    (_grad_no_zero, "accumulate")])(global_mean_grad)
