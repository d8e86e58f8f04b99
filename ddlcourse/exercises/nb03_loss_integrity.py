"""Exercises of notebooks/03_loss_integrity.ipynb."""
import math

from ddlcourse.selfcheck import code_exercise, diagnose, exercise


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


@code_exercise("global_mean_loss")
def check_global_mean_loss(fn, **_):
    """Uneven shares (5, 3, 2, 1 samples on 4 ranks): each rank's value of ``fn`` must equal
    ``losses.global_mean_loss``; their mean over the ranks is then the serial mean loss."""
    import torch

    from ddlcourse import losses

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
