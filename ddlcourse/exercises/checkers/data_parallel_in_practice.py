"""Checkers of notebooks/06_data_parallel_in_practice.ipynb: fp16 compression's bytes, and gradient accumulation with
DDP's ``no_sync`` written by the learner (``accumulate_step``), checked against serial steps on the global batch."""
import torch
import torch.nn.functional as F

from ddlcourse import dist
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, exercise


@exercise("fp16_bytes_saved", "float32 takes 4 bytes per number, float16 takes 2")
def fp16_bytes_saved(n_params: int) -> int:
    return 2 * n_params


# --------------------------------------------------------------------------- build it: gradient accumulation
_ACC_K, _ACC_M, _ACC_STEPS, _ACC_LR = 3, 2, 2, 0.1     # micro-batches per rank, samples per micro-batch, steps, lr
_ACC_NOT_DIVIDED = "k times too large"
_ACC_NEVER_SYNCED = "never synchronised"
_ACC_WASTEFUL = "extra all-reduces"
_ACC_STEP_INSIDE = "inside the loop"
_ACC_NO_ZERO = "zero the gradients"


def _acc_model(device):
    """The same small MLP (float64) on every rank: the checker does not test the broadcast."""
    torch.manual_seed(11)
    L = torch.nn.Linear
    return torch.nn.Sequential(L(6, 8), torch.nn.Tanh(), L(8, 8), torch.nn.Tanh(), L(8, 3)).to(
        device=device, dtype=torch.float64)


class _CountingSGD(torch.optim.SGD):
    """SGD with momentum that counts its steps."""

    def __init__(self, params):
        super().__init__(params, lr=_ACC_LR, momentum=0.9)
        self.n_steps = 0

    def step(self, closure=None):
        self.n_steps += 1
        return super().step(closure)


def _counting_hook(state, bucket):
    """A DDP communication hook: counts the buckets DDP all-reduces, then all-reduces them as DDP does."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    state["allreduces"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def _ddp(device):
    """The checker's model in DDP, with the counting hook; returns (ddp, counter)."""
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(_acc_model(device), device_ids=ids)
    state = {"allreduces": 0}
    ddp.register_comm_hook(state, _counting_hook)
    return ddp, state


def _flat(tensors):
    return torch.cat([t.detach().flatten() for t in tensors])


def _close(a, b, tol=1e-10):
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=tol, atol=tol))


@code_exercise("accumulate_step", distributed=True, ranks=(2, 3))
def check_accumulate_step(fn, **_):
    """On every rank: ``fn(ddp_model, micro_batches, optimizer, loss_fn)`` takes 2 steps of SGD + momentum of a
    small MLP (float64) in DDP, each on this rank's share of a global batch (k = 3 micro-batches of 2 samples per
    rank). After each step the gradients and parameters must be those of one serial step on the whole global
    batch (same device, 1e-10), the optimizer must have stepped once, and DDP must have all-reduced each of its
    buckets once (a communication hook counts them); the return value is this rank's mean loss."""
    info = dist.init()
    r, n, dev = info.rank, info.world_size, info.device
    k, m, steps = _ACC_K, _ACC_M, _ACC_STEPS
    gb = n * k * m
    g = torch.Generator().manual_seed(23)
    X = torch.randn(steps * gb, 6, generator=g, dtype=torch.float64).to(dev)
    y = torch.randint(0, 3, (steps * gb,), generator=g).to(dev)
    batches = [torch.arange(s * gb, (s + 1) * gb, device=dev) for s in range(steps)]

    # the serial reference: one process, the whole global batch, the same device
    model = _acc_model(dev)
    opt = torch.optim.SGD(model.parameters(), lr=_ACC_LR, momentum=0.9)
    ref_grads, ref_params, ref_loss = [], [], []
    for idx in batches:
        with torch.no_grad():
            share = idx[r::n]
            ref_loss.append(float(F.cross_entropy(model(X[share]), y[share])))
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), y[idx]).backward()
        ref_grads.append(_flat(p.grad for p in model.parameters()))
        opt.step()
        ref_params.append(_flat(model.parameters()))

    probe, count = _ddp(dev)                          # how many buckets DDP all-reduces in one backward
    F.cross_entropy(probe(X[:m]), y[:m]).backward()
    buckets = count["allreduces"]

    ddp, count = _ddp(dev)
    opt = _CountingSGD(ddp.parameters())
    verdict = Verdict(True)
    for s, idx in enumerate(batches):
        share = idx[r::n]
        micro = [(X[c], y[c]) for c in share.split(m)]
        a0, s0 = count["allreduces"], opt.n_steps
        out = fn(ddp, micro, opt, F.cross_entropy)
        allreduces, n_steps = count["allreduces"] - a0, opt.n_steps - s0
        grads = [p.grad for p in ddp.module.parameters()]
        where, v = f"step {s + 1}", Verdict(True)
        if n_steps == k:
            v = Verdict(False, f"{where}: the optimizer stepped {k} times, once per micro-batch: you stepped it "
                        f"{_ACC_STEP_INSIDE}. Step once, after the last micro-batch's backward")
        elif n_steps != 1:
            v = Verdict(False, f"{where}: the optimizer stepped {n_steps} times; call optimizer.step() once, "
                        "after the last micro-batch's backward")
        elif allreduces == 0:
            v = Verdict(False, f"{where}: DDP launched no all-reduce, so the gradients were {_ACC_NEVER_SYNCED} "
                        "and each rank stepped with its own: you wrapped every micro-batch in no_sync(), "
                        "the last one too. Leave the last backward outside no_sync()")
        elif any(p is None for p in grads):
            v = Verdict(False, f"{where}: some parameters have no gradient after your step: run backward on "
                        "every micro-batch's loss")
        else:
            got = _flat(grads)
            if _close(got, k * ref_grads[s]):
                v = Verdict(False, f"{where}: the gradient is {_ACC_NOT_DIVIDED} (k = {k}): the micro-batch "
                            "gradients add up in .grad: divide each micro-batch's loss by k, so that their sum is "
                            "the gradient of the mean")
            elif s > 0 and _close(got, ref_grads[s] + ref_grads[s - 1]):
                v = Verdict(False, f"{where}: the gradient holds the previous step's too: {_ACC_NO_ZERO} "
                            "(optimizer.zero_grad()) before the first micro-batch")
            elif not _close(got, ref_grads[s]):
                err = float((got - ref_grads[s]).abs().max())
                v = Verdict(False, f"{where}: the gradients after your step differ from the serial gradient "
                            f"of the global batch by up to {err:.3g}")
            elif not _close(_flat(ddp.module.parameters()), ref_params[s]):
                v = Verdict(False, f"{where}: the gradients are right but the parameters are not those of one "
                            "serial step: step the optimizer once, after the last backward")
            elif out is None or abs(float(out) - ref_loss[s]) > 1e-9:
                v = Verdict(False, f"{where}: you returned {out!r}, expected this rank's mean loss over its "
                            f"micro-batches, {ref_loss[s]:.6f} (a float: the mean of the k micro-batch "
                            "losses)")
            elif allreduces == k * buckets:
                v = Verdict(False, f"{where}: the step is right but wasteful: DDP all-reduced after every "
                            f"micro-batch, {allreduces} all-reduces instead of {buckets} "
                            f"({_ACC_WASTEFUL}, k times the traffic). Wrap every backward but the last "
                            "in ddp_model.no_sync()")
            elif allreduces != buckets:
                v = Verdict(False, f"{where}: DDP all-reduced {allreduces} buckets, expected {buckets}: one "
                            "all-reduce per bucket, on the last micro-batch's backward only")
        if verdict.ok:                       # the first wrong step; every rank runs every step (DDP's collectives)
            verdict = v
    return agreed(verdict)
