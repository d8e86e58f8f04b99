"""Checkers of notebooks/12_large_batch.ipynb: the reference answers of its questions, and the checkers of the LARS
and LAMB trust ratios and of the whole LAMB step the learner writes."""
import math

import torch

from ddlcourse import optim
from ddlcourse.exercises.solutions.large_batch import LAMB_RATIO_VARIANTS, LAMB_VARIANTS, LARS_VARIANTS, _lamb_variant
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("steps_per_epoch", "one step consumes one global batch; keep the last, smaller batch (as in notebook "
          "01, SGD): round up with ceil, not down")
def steps_per_epoch(n_train: int, global_batch: int) -> int:
    return math.ceil(n_train / global_batch)


@exercise("sqrt_scaled_lr", "square-root scaling: lr grows with the square root of the batch ratio")
def sqrt_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    return base_lr * math.sqrt(global_batch / base_batch)


# --------------------------------------------------------------------------- coding exercises: trust ratios
def _layers():
    """(weight, grad, adam_step) triples of a few layers whose norms differ by orders of magnitude."""
    g = torch.Generator().manual_seed(7)
    out = []
    for shape, w_scale, g_scale in (((16, 8), 1.0, 0.01), ((8,), 0.1, 1.0), ((4, 4, 3), 3.0, 0.2), ((5,), 0.5, 5.0)):
        out.append((torch.randn(*shape, generator=g, dtype=torch.float64) * w_scale,
                    torch.randn(*shape, generator=g, dtype=torch.float64) * g_scale,
                    torch.randn(*shape, generator=g, dtype=torch.float64)))
    return out


LARS_HINTS = {
    "no_decay": "you left out the weight decay term: the denominator is ||g|| + weight_decay * ||w||",
    "no_eta": "you left out the trust coefficient eta: multiply by eta",
    "upside_down": "your ratio is upside down: the weight norm goes on top, eta * ||w|| / (||g|| + weight_decay * "
                   "||w||)",
    "squared": "you used squared norms (sums of squares): take the square root, torch.linalg.vector_norm",
}


@code_exercise("lars_trust_ratio")
def check_lars_trust_ratio(fn, **_):
    """``fn(weight, grad, eta, weight_decay) -> float`` against ``optim.lars_trust_ratio`` on four layers."""
    eta, wd = 0.02, 0.01
    layers = _layers()

    def ratios(f):
        return [float(f(w.clone(), g.clone(), eta, wd)) for w, g, _ in layers]

    mistakes = {hint: ratios(LARS_VARIANTS[kind]) for kind, hint in LARS_HINTS.items()}
    v = diagnose(ratios(fn), ratios(optim.lars_trust_ratio), mistakes, rtol=1e-8, atol=1e-12,
                 what="the trust ratios of the four layers")
    if v.ok:   # a zero-initialised layer (a bias at step 0): the ratio must not be 0 or NaN
        z = torch.zeros(5, dtype=torch.float64)
        r = float(fn(z, torch.ones(5, dtype=torch.float64), eta, wd))
        v = diagnose(r, optim.lars_trust_ratio(z, torch.ones(5, dtype=torch.float64), eta, wd),
                     {"a zero weight gives ratio 0, so the layer never moves: return 1 when ||w|| is 0": 0.0},
                     what="the ratio of an all-zero weight")
    return v


LAMB_RATIO_HINTS = {
    "no_decay": "you left out the weight decay: the update is u = adam_step + weight_decay * w, and the ratio is "
                "||w|| / ||u||",
    "upside_down": "your ratio is upside down: ||w|| / ||adam_step + weight_decay * w||",
    "squared": "you used squared norms (sums of squares): take the square root, torch.linalg.vector_norm",
}


@code_exercise("lamb_trust_ratio")
def check_lamb_trust_ratio(fn, **_):
    """``fn(weight, adam_step, weight_decay) -> float`` against ``optim.lamb_trust_ratio`` on four layers."""
    wd = 0.01
    layers = _layers()

    def ratios(f):
        return [float(f(w.clone(), u.clone(), wd)) for w, _, u in layers]

    mistakes = {hint: ratios(LAMB_RATIO_VARIANTS[kind]) for kind, hint in LAMB_RATIO_HINTS.items()}
    v = diagnose(ratios(fn), ratios(optim.lamb_trust_ratio), mistakes, rtol=1e-8, atol=1e-12,
                 what="the trust ratios of the four layers")
    if v.ok:
        z = torch.zeros(5, dtype=torch.float64)
        r = float(fn(z, torch.ones(5, dtype=torch.float64), wd))
        v = diagnose(r, optim.lamb_trust_ratio(z, torch.ones(5, dtype=torch.float64), wd),
                     {"a zero weight gives ratio 0, so the layer never moves: return 1 when ||w|| is 0": 0.0},
                     what="the ratio of an all-zero weight")
    return v


# --------------------------------------------------------------------------- build it: the whole LAMB step
LAMB_HINTS = {
    "grad": "your trust ratio divides by the gradient norm: LAMB divides ||w|| by the norm of the update "
            "u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w",
    "guard": "the all-zero layer (a bias at step 0) never moves: with ||w|| = 0 the ratio is 0; take it as 1 "
             "when ||w|| or ||u|| is 0 (the zero-norm guard)",
    "decay": "you applied the weight decay outside the trust ratio: put it inside the update, "
             "u = adam_step + weight_decay * w, then w -= lr * ratio * u",
    "bias": "no bias correction: divide m by (1 - beta1**t) and v by (1 - beta2**t), with t = 1 at the first step",
    "state": "the moments start from zero at every call: create m, v and the step count once, in `state`, "
             "and keep them between steps",
}
LAMB_SETTINGS = dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _lamb_run(fn, steps: int = 4):
    """Run ``fn`` for ``steps`` steps on four layers (one a zero-initialised bias) of a quadratic loss whose
    gradient depends on the parameters, so an error compounds; the flat parameters after each step."""
    g = torch.Generator().manual_seed(11)
    shapes, scales = ((6, 4), (4,), (3, 3, 2), (5,)), (1.0, 0.0, 3.0, 0.2)      # 0.0: the zero bias
    params = [torch.randn(*s, generator=g, dtype=torch.float64) * k for s, k in zip(shapes, scales)]
    targets = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    noise = [[torch.randn(*s, generator=g, dtype=torch.float64) * 0.1 for s in shapes] for _ in range(steps)]
    state, out = {}, []
    for k in range(steps):
        grads = [(p - t) * (i + 1) + n for i, (p, t, n) in enumerate(zip(params, targets, noise[k]))]
        before = [p.clone() for p in params]
        with torch.no_grad():
            fn(params, grads, state, **LAMB_SETTINGS)
        if all(torch.equal(a, b) for a, b in zip(before, params)):
            return None
        out.append(torch.cat([p.detach().flatten() for p in params]).numpy().copy())
    return out


@code_exercise("lamb_step")
def check_lamb_step(fn, **_):
    """``fn(params, grads, state, lr, betas, eps, weight_decay)`` for four steps: the parameters after every
    step must equal the reference LAMB (Adam moments with bias correction, the package's
    ``optim.lamb_trust_ratio``) within 1e-9."""
    import numpy as np

    got = _lamb_run(fn)
    if got is None:
        return Verdict(False, "the parameters did not change: update each tensor of `params` in place "
                              "(p.sub_(...) or p -= ...), do not rebind the name")
    if not all(np.isfinite(x).all() for x in got):
        return Verdict(False, "the parameters hold NaN or inf: count the steps from t = 1 (1 - beta**0 is 0), "
                              "and guard the trust ratio against zero norms")
    mistakes = {hint: _lamb_run(LAMB_VARIANTS[kind]) for kind, hint in LAMB_HINTS.items()}
    # no function of the package takes one LAMB step with the template's signature: the solutions module's right
    # step (Adam moments with bias correction, the trust ratio from optim.lamb_trust_ratio)
    return diagnose(got, _lamb_run(_lamb_variant()), mistakes, rtol=1e-9, atol=1e-12,
                    what="the parameters after each of 4 LAMB steps")
