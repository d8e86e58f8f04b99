"""Checkers of notebooks/05_data_parallel.ipynb and labs/01_maize.ipynb (which trains with the learner's MyDDP): the
questions, the gradient-averaging hook (checked against ``data_parallel.average_grad_hook``) and MyDDP (against
serial training)."""
import numpy as np
import torch

from ddlcourse import dist
from ddlcourse.exercises.solutions.data_parallel import HOOK_VARIANTS
from ddlcourse.models.small import MLP
from ddlcourse.parallel import data_parallel as dp
from ddlcourse.selfcheck import AllReduceSpy, Verdict, code_exercise, diagnose, exercise, raised


@exercise("global_batch", "every rank processes its own micro-batch in each step")
def global_batch(micro_batch: int, world_size: int) -> int:
    return micro_batch * world_size


@exercise("linear_scaled_lr", "linear scaling (Goyal et al. 2017): lr grows by the same factor as the global batch")
def linear_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    return base_lr * global_batch / base_batch


# --------------------------------------------------------------------------- coding exercise: the gradient hook
HOOK_HINTS = {
    "sum": "you summed the gradients: divide by the number of ranks (tdist.get_world_size())",
    "local": "you divided but never communicated: all-reduce p.grad (op SUM) over the ranks first",
    "params": "you all-reduced the parameter p.data: the hook must average the gradient, p.grad",
}


def _grads_with_hook(hook, seed: int = 5):
    """Every rank: one backward of a small MLP on its own batch with ``hook`` on each parameter; the flat
    gradient and parameters afterwards (NumPy)."""
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


@code_exercise("average_grad_hook", distributed=True, ranks=(2, 3))
def check_average_grad_hook(fn, **_):
    """On every rank: ``fn(p)``, registered as each parameter's post-accumulate-grad hook, must leave the same
    gradients (and parameters) as ``data_parallel.average_grad_hook``."""
    dist.init()
    ref = _grads_with_hook(dp.average_grad_hook)
    mistakes = {hint: _grads_with_hook(HOOK_VARIANTS[kind]) for kind, hint in HOOK_HINTS.items()}
    return diagnose(_grads_with_hook(fn), ref, mistakes, rtol=1e-10, atol=1e-12,
                    what=f"rank {dist.rank()}'s gradients and parameters after backward")


# --------------------------------------------------------------------------- build it: DDP from scratch
_DDP_NO_BROADCAST = "the ranks start from different parameters"
_DDP_SUM = "you summed the gradients"
_DDP_EARLY = "waits for its bucket's allreduce during backward"
_DDP_NOT_IN_HOOK = "no allreduce starts during backward"
_DDP_UNFLUSHED = "were never all-reduced"
_DDP_UNUSED = "gets no gradient"
_DDP_CAP_MB = 0.0006        # ~600 bytes: the checker's models (float64) make 3 buckets, the last one not full


def _ddp_mlp(seed, device):
    torch.manual_seed(seed)
    L = torch.nn.Linear
    return torch.nn.Sequential(L(6, 8), torch.nn.Tanh(), L(8, 8), torch.nn.Tanh(), L(8, 8), torch.nn.Tanh(),
                               L(8, 3)).to(device=device, dtype=torch.float64)


class _TwoHeads(torch.nn.Module):
    """A body and two heads; forward uses head a only, so head b's parameters get no gradient."""

    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.a(torch.tanh(self.body(x)))


def _two_heads(seed, device):
    torch.manual_seed(seed)
    return _TwoHeads().to(device=device, dtype=torch.float64)


def _ddp_train(make_model, fn, X, y, steps, global_batch, r, n, seed, spy=None, per_step=None):
    """Train ``make_model`` (seeded per rank) wrapped in ``fn`` (None: serial, on the whole global batch) with
    SGD + momentum. Returns (parameters after construction, gradients of step 0, final parameters). With ``spy``,
    ``per_step`` gets each step's allreduces as ``(during backward?, bytes)``."""
    model = make_model(seed)
    net = fn(model, bucket_cap_mb=_DDP_CAP_MB, group=None) if fn is not None else model
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads0 = None
    for step in range(steps):
        seen = len(spy.calls) if spy is not None else 0
        idx = torch.arange(global_batch) + step * global_batch
        mine = idx[r::n]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(X[mine]), y[mine])
        if spy is not None:
            spy.watching = True
        loss.backward()
        if spy is not None:
            spy.watching = False
        if fn is not None:
            net.finish_gradient_synchronization()
        if per_step is not None:
            per_step.append([(w, nbytes) for w, _, nbytes in spy.calls[seen:]])
        if step == 0:
            grads0 = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        opt.step()
    return start, grads0, [p.detach().clone() for p in model.parameters()]


def _param_bytes_in_backward(model) -> list[int]:
    """The bytes of each parameter, in the order backward makes their gradients: from the last one back."""
    return [q.numel() * q.element_size() for q in list(model.parameters())[::-1]]


def _buckets_in_backward(params: list[int], cap: int) -> list[int]:
    """The bytes of DDP's buckets over parameters of ``params`` bytes (in backward order): a bucket closes once
    it holds ``cap`` bytes (the last one may not be full)."""
    sizes, held = [], 0
    for nbytes in params:
        held += nbytes
        if held >= cap:
            sizes, held = sizes + [held], 0
    return sizes + ([held] if held else [])


def _runs_of(sizes: list[int], params: list[int]) -> list[list[int]] | None:
    """``params`` cut into runs of consecutive parameters whose bytes are ``sizes`` (covering them all, in their
    order), or None when they cannot be."""
    runs, i = [], 0
    for size in sizes:
        run = []
        while sum(run) < size and i < len(params):
            run, i = run + [params[i]], i + 1
        if sum(run) != size:
            return None
        runs.append(run)
    return runs if i == len(params) else None


def _bucket_verdict(per_step: list, params: list[int], cap: int) -> Verdict | None:
    """What the allreduces of each step say about the buckets (None: buckets of consecutive parameters in
    backward order, each closed at the cap as DDP does, or just before it, started during backward).
    ``params``: the parameters' bytes in backward order; ``cap``: bucket_cap_mb in bytes."""
    during = [[b for w, b in calls if w] for calls in per_step]
    if during[0] and any(not d for d in during[1:]):
        k = next(i for i, d in enumerate(during) if not d)
        return Verdict(False, f"the first backward starts its buckets, but backward {k + 1} starts none: the per-bucket "
                              "counts are never reset. In finish_gradient_synchronization set them back to 0, ready "
                              "for the next backward")
    sent = [b for _, b in per_step[0]]
    ddp = _buckets_in_backward(params, cap)
    if len(sent) == len(params) > len(ddp) and sorted(sent) == sorted(params):
        return Verdict(False, f"one allreduce per parameter ({len(sent)} messages in a step, where buckets of "
                              f"bucket_cap_mb make {len(ddp)}): pack the gradients into buckets and all-reduce each "
                              "bucket once, or every small tensor pays the latency of a message")
    forward = _buckets_in_backward(params[::-1], cap)[::-1]      # filled from the first parameter, started in backward
    if during[0] == forward != ddp:
        return Verdict(False, f"your buckets ({during[0]} bytes, in the order they started) hold the parameters in "
                              "forward order: backward makes the last layer's gradients first, so fill the buckets "
                              "from the last parameter back (reversed(params)); filled from the front, the first "
                              "bucket to start is the small remainder and the big ones wait for the whole backward")
    runs = _runs_of(during[0], params)
    if runs is None:
        return Verdict(False, f"your buckets ({during[0]} bytes, in the order they started) are not runs of "
                              f"consecutive parameters in backward order (DDP's would be {ddp} bytes): a bucket "
                              "holds the gradients backward makes one after the other, and starts with the last")
    for k, run in enumerate(runs[:-1]):
        held, nxt = sum(run), runs[k + 1][0]
        if not ((held >= cap and held - run[-1] < cap) or (held <= cap < held + nxt)):
            return Verdict(False, f"a bucket of {held} bytes, where bucket_cap_mb is {cap} bytes: close a bucket when "
                                  "it reaches the cap (all but the last), so that each message carries about "
                                  "bucket_cap_mb")
    return None


def _same(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=tol, atol=tol))


def _agree_across_ranks(tensors) -> bool:
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    flat = torch.cat([t.flatten() for t in tensors]).cpu().numpy()
    every = MPI.COMM_WORLD.allgather(flat)
    return all(np.allclose(e, every[0], rtol=1e-12, atol=1e-12) for e in every)


@code_exercise("my_ddp", distributed=True, ranks=(2, 3))
def check_my_ddp(fn, **_):
    """On every rank: ``fn(module, bucket_cap_mb, group)`` wraps a 4-layer MLP (float64, 3 buckets of ~600 bytes,
    the last not full), trains 3 steps of SGD + momentum on this rank's share of a global batch of 12, and must
    end at the serial parameters; then again on a model with a head that gets no gradient."""
    info = dist.init()
    r, n, dev = info.rank, info.world_size, info.device
    steps, gb = 3, 12
    g = torch.Generator().manual_seed(21)
    X = torch.randn(steps * gb, 6, generator=g, dtype=torch.float64).to(dev)
    y = torch.randint(0, 3, (steps * gb,), generator=g).to(dev)
    seed0 = dist.seed_for_rank(7, 0)
    serial = _ddp_train(lambda s: _ddp_mlp(s, dev), None, X, y, steps, gb, 0, 1, seed0)
    local = _ddp_train(lambda s: _ddp_mlp(s, dev), None, X, y, 1, gb, r, n, seed0)   # this rank's share, alone
    per_step = []
    with AllReduceSpy() as spy:
        start, grads0, final = _ddp_train(lambda s: _ddp_mlp(s, dev), fn, X, y, steps, gb, r, n,
                                          dist.seed_for_rank(7, r), spy, per_step)
    if not (_agree_across_ranks(start) and all(_same(a, b) for a, b in zip(start, serial[0]))):
        return Verdict(False, f"{_DDP_NO_BROADCAST}: broadcast rank 0's parameters in __init__ "
                              "(tdist.broadcast(p.data, src=0, group=group)), since each rank initialised its own")
    kinds = []
    for got, ref, loc in zip(grads0, serial[1], local[1]):
        kinds.append("ok" if _same(got, ref) else "sum" if got is not None and _same(got, n * ref)
                     else "local" if _same(got, loc) else "other")
    if all(k == "sum" for k in kinds):
        return Verdict(False, f"{_DDP_SUM} over the ranks: divide each bucket by the world size after its "
                              "allreduce (the mean gradient is the gradient of the global batch)")
    if "local" in kinds:
        return Verdict(False, f"the gradients of {kinds.count('local')} of the {len(kinds)} parameters {_DDP_UNFLUSHED}"
                              " (they are this rank's own): every parameter must sit in a bucket whose allreduce "
                              "runs; is the last bucket, the one that never gets full, launched too?")
    if "other" in kinds:
        err = max(float((a - b).abs().max()) for a, b, k in zip(grads0, serial[1], kinds)
                  if k == "other" and a is not None)
        return Verdict(False, f"after finish_gradient_synchronization the gradients of {kinds.count('other')} "
                              f"parameters differ from the serial gradient of the global batch by up to {err:.3g}")
    if not all(_same(a, b) for a, b in zip(final, serial[2])):
        return Verdict(False, f"the first step is right, but after {steps} steps the parameters differ from the "
                              "serial ones: reset the per-bucket counts and the pending handles in "
                              "finish_gradient_synchronization, ready for the next backward")
    if spy.launched and (spy.waits or spy.blocking):
        return Verdict(False, f"your hook {_DDP_EARLY} (or starts it with async_op=False): start it with "
                              "async_op=True, keep the handle and wait in finish_gradient_synchronization, so that "
                              "communication overlaps the rest of backward")
    if spy.launched and not any(spy.launched):
        return Verdict(False, f"{_DDP_NOT_IN_HOOK}: the hook must start a bucket's allreduce as soon as its last "
                              "gradient is ready, not finish_gradient_synchronization")
    buckets = _bucket_verdict(per_step, _param_bytes_in_backward(_ddp_mlp(0, dev)), int(_DDP_CAP_MB * 2 ** 20))
    if buckets is not None:
        return buckets
    serial2 = _ddp_train(lambda s: _two_heads(s, dev), None, X, y, 2, gb, 0, 1, seed0)
    # The head is unused on every rank, so every rank starts the same allreduces whatever the class does: a class
    # that ignores it leaves a bucket unreduced (the ranks drift apart), it cannot deadlock the check.
    advice = ("its hook never runs, so its bucket never gets full. In finish_gradient_synchronization, start every "
              "bucket that backward did not, with zeros for the missing gradients (what find_unused_parameters=True "
              "does in DDP)")
    try:
        _, _, final2 = _ddp_train(lambda s: _two_heads(s, dev), fn, X, y, 2, gb, r, n, dist.seed_for_rank(7, r))
    except Exception as e:                  # e.g. waiting for the handle of a bucket that was never started
        raised(e)
        return Verdict(False, f"with a parameter that {_DDP_UNUSED} (a head that forward does not use) your class "
                              f"raised {type(e).__name__}: {e}. The parameter's {advice}")
    if not (all(_same(a, b) for a, b in zip(final2, serial2[2])) and _agree_across_ranks(final2)):
        return Verdict(False, f"with a parameter that {_DDP_UNUSED} (a head that forward does not use) training "
                              f"goes wrong: {advice}")
    return Verdict(True)
