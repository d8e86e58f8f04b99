"""Exercises of notebooks/05_data_parallel.ipynb."""
from ddlcourse.selfcheck import code_exercise, diagnose, exercise


@exercise("global_batch", "every rank processes its own micro-batch in each step")
def global_batch(micro_batch: int, world_size: int) -> int:
    return micro_batch * world_size


@exercise("fp16_bytes_saved", "float32 takes 4 bytes per number, float16 takes 2")
def fp16_bytes_saved(n_params: int) -> int:
    return 2 * n_params


@exercise("linear_scaled_lr", "linear scaling (Goyal et al. 2017): lr grows by the same factor as the global batch")
def linear_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    return base_lr * global_batch / base_batch


# --------------------------------------------------------------------------- coding exercise: the gradient hook
def _hook_sum(p):
    """Mistake: sums the gradients over the ranks and forgets to divide."""
    import torch.distributed as tdist
    tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM)


def _hook_local(p):
    """Mistake: divides by the number of ranks but never communicates."""
    import torch.distributed as tdist
    p.grad.div_(tdist.get_world_size())


def _hook_params(p):
    """Mistake: all-reduces the parameter (p.data) instead of its gradient, then divides the gradient."""
    import torch.distributed as tdist
    tdist.all_reduce(p.data, op=tdist.ReduceOp.SUM)
    p.data.div_(tdist.get_world_size())


def _grads_with_hook(hook, seed: int = 5):
    """Every rank: one backward of a small MLP on its own batch with ``hook`` on each parameter; the flat
    gradient and parameters afterwards (NumPy)."""
    import torch

    from ddlcourse import dist
    from ddlcourse.models.small import MLP

    torch.manual_seed(seed)                                          # the same initial model on every rank
    model = MLP(6, 3, hidden=8).to(torch.float64)
    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    g = torch.Generator().manual_seed(dist.seed_for_rank(seed, dist.rank()))
    x = torch.randn(4 + dist.rank(), 6, generator=g, dtype=torch.float64)   # (m_r, 6): a different batch per rank
    t = torch.randint(0, 3, (len(x),), generator=g)
    torch.nn.functional.cross_entropy(model(x), t).backward()
    for h in handles:
        h.remove()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()] +
                     [p.detach().flatten() for p in model.parameters()])
    return flat.numpy()


@code_exercise("average_grad_hook", distributed=True)
def check_average_grad_hook(fn, **_):
    """On every rank: ``fn(p)``, registered as each parameter's post-accumulate-grad hook, must leave the same
    gradients (and parameters) as ``data_parallel.average_grad_hook``."""
    from ddlcourse import dist
    from ddlcourse.parallel import data_parallel as dp

    dist.init(horovod=False)
    ref = _grads_with_hook(dp.average_grad_hook)
    mistakes = {
        "you summed the gradients: divide by the number of ranks (tdist.get_world_size())":
            _grads_with_hook(_hook_sum),
        "you divided but never communicated: all-reduce p.grad (op SUM) over the ranks first":
            _grads_with_hook(_hook_local),
        "you all-reduced the parameter p.data: the hook must average the gradient, p.grad":
            _grads_with_hook(_hook_params),
    }
    return diagnose(_grads_with_hook(fn), ref, mistakes, rtol=1e-10, atol=1e-12,
                    what=f"rank {dist.rank()}'s gradients and parameters after backward")
