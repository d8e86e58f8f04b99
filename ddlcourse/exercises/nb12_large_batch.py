"""Exercises of notebooks/12_large_batch.ipynb."""
import math

import torch

from ddlcourse import optim
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


def _norm(t):
    return float(torch.linalg.vector_norm(t))


def my_lars_trust_ratio(weight, grad, eta, weight_decay):
    """The reference a learner would write for exercise 4."""
    w_norm = torch.linalg.vector_norm(weight)
    g_norm = torch.linalg.vector_norm(grad)
    denom = g_norm + weight_decay * w_norm
    if w_norm == 0 or denom == 0:
        return 1.0
    return float(eta * w_norm / denom)


def _lars_no_decay(weight, grad, eta, weight_decay):
    return eta * _norm(weight) / _norm(grad)


def _lars_no_eta(weight, grad, eta, weight_decay):
    return _norm(weight) / (_norm(grad) + weight_decay * _norm(weight))


def _lars_upside_down(weight, grad, eta, weight_decay):
    return eta * (_norm(grad) + weight_decay * _norm(weight)) / _norm(weight)


def _lars_squared(weight, grad, eta, weight_decay):
    return eta * _norm(weight) ** 2 / (_norm(grad) ** 2 + weight_decay * _norm(weight) ** 2)


def _lars_no_guard(weight, grad, eta, weight_decay):
    return eta * _norm(weight) / (_norm(grad) + weight_decay * _norm(weight))


@code_exercise("lars_trust_ratio", solution=my_lars_trust_ratio, mistakes=[
    (_lars_no_decay, "left out the weight decay term"), (_lars_no_eta, "trust coefficient eta"),
    (_lars_upside_down, "upside down"), (_lars_squared, "squared norms"), (_lars_no_guard, "never moves")])
def check_lars_trust_ratio(fn, **_):
    """``fn(weight, grad, eta, weight_decay) -> float`` against ``optim.lars_trust_ratio`` on four layers."""
    eta, wd = 0.02, 0.01
    layers = _layers()

    def ratios(f):
        return [float(f(w.clone(), g.clone(), eta, wd)) for w, g, _ in layers]

    mistakes = {
        "you left out the weight decay term: the denominator is ||g|| + weight_decay * ||w||": ratios(_lars_no_decay),
        "you left out the trust coefficient eta: multiply by eta": ratios(_lars_no_eta),
        "your ratio is upside down: the weight norm goes on top, eta * ||w|| / (||g|| + weight_decay * ||w||)":
            ratios(_lars_upside_down),
        "you used squared norms (sums of squares): take the square root, torch.linalg.vector_norm":
            ratios(_lars_squared),
    }
    v = diagnose(ratios(fn), ratios(optim.lars_trust_ratio), mistakes, rtol=1e-8, atol=1e-12,
                 what="the trust ratios of the four layers")
    if v.ok:   # a zero-initialised layer (a bias at step 0): the ratio must not be 0 or NaN
        z = torch.zeros(5, dtype=torch.float64)
        r = float(fn(z, torch.ones(5, dtype=torch.float64), eta, wd))
        v = diagnose(r, optim.lars_trust_ratio(z, torch.ones(5, dtype=torch.float64), eta, wd),
                     {"a zero weight gives ratio 0, so the layer never moves: return 1 when ||w|| is 0": 0.0},
                     what="the ratio of an all-zero weight")
    return v


def my_lamb_trust_ratio(weight, adam_step, weight_decay):
    """The reference a learner would write for exercise 5."""
    update = adam_step + weight_decay * weight
    w_norm = torch.linalg.vector_norm(weight)
    u_norm = torch.linalg.vector_norm(update)
    if w_norm == 0 or u_norm == 0:
        return 1.0
    return float(w_norm / u_norm)


def _lamb_ratio_no_decay(weight, adam_step, weight_decay):
    return _norm(weight) / _norm(adam_step)


def _lamb_ratio_upside_down(weight, adam_step, weight_decay):
    return _norm(adam_step + weight_decay * weight) / _norm(weight)


def _lamb_ratio_squared(weight, adam_step, weight_decay):
    return _norm(weight) ** 2 / _norm(adam_step + weight_decay * weight) ** 2


def _lamb_ratio_no_guard(weight, adam_step, weight_decay):
    return _norm(weight) / _norm(adam_step + weight_decay * weight)


@code_exercise("lamb_trust_ratio", solution=my_lamb_trust_ratio, mistakes=[
    (_lamb_ratio_no_decay, "left out the weight decay"), (_lamb_ratio_upside_down, "upside down"),
    (_lamb_ratio_squared, "squared norms"), (_lamb_ratio_no_guard, "never moves")])
def check_lamb_trust_ratio(fn, **_):
    """``fn(weight, adam_step, weight_decay) -> float`` against ``optim.lamb_trust_ratio`` on four layers."""
    wd = 0.01
    layers = _layers()

    def ratios(f):
        return [float(f(w.clone(), u.clone(), wd)) for w, _, u in layers]

    mistakes = {
        "you left out the weight decay: the update is u = adam_step + weight_decay * w, and the ratio is ||w|| / ||u||":
            ratios(_lamb_ratio_no_decay),
        "your ratio is upside down: ||w|| / ||adam_step + weight_decay * w||": ratios(_lamb_ratio_upside_down),
        "you used squared norms (sums of squares): take the square root, torch.linalg.vector_norm":
            ratios(_lamb_ratio_squared),
    }
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
def my_lamb_step(params, grads, state, lr, betas, eps, weight_decay):
    """The reference a learner would write: one LAMB step (You et al. 2020), in place."""
    beta1, beta2 = betas
    if not state:
        state["step"] = 0
        state["m"] = [torch.zeros_like(p) for p in params]
        state["v"] = [torch.zeros_like(p) for p in params]
    state["step"] += 1
    t = state["step"]
    for p, g, m, v in zip(params, grads, state["m"], state["v"]):
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        m_hat = m / (1 - beta1 ** t)
        v_hat = v / (1 - beta2 ** t)
        u = m_hat / (v_hat.sqrt() + eps) + weight_decay * p
        w_norm = torch.linalg.vector_norm(p)
        u_norm = torch.linalg.vector_norm(u)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        p.sub_(lr * ratio * u)


def _lamb_variant(ratio_from: str = "update", guard: bool = True, decay_inside: bool = True,
                  bias_correction: bool = True, keep_state: bool = True):
    """A LAMB step with the template's signature, right by default, with one typical mistake otherwise.
    The right one takes its trust ratio from the package's ``optim.lamb_trust_ratio``."""
    def step(params, grads, state, lr, betas, eps, weight_decay):
        b1, b2 = betas
        if not state or not keep_state:
            state.update(t=state.get("t", 0), m=[torch.zeros_like(p) for p in params],
                         v=[torch.zeros_like(p) for p in params])
        state["t"] += 1
        t = state["t"]
        for p, g, m, v in zip(params, grads, state["m"], state["v"]):
            m.mul_(b1).add_((1 - b1) * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if bias_correction else (1.0, 1.0)
            a = (m / c1) / ((v / c2).sqrt() + eps)
            if not decay_inside:         # decoupled decay beside the trust ratio, as in AdamW
                r = optim.lamb_trust_ratio(p, a, 0.0)
                p.sub_(lr * (r * a + weight_decay * p))
                continue
            u = a + weight_decay * p
            if ratio_from == "grad":
                r = _norm(p) / _norm(g) if _norm(p) > 0 and _norm(g) > 0 else 1.0
            elif not guard:
                r = _norm(p) / _norm(u)
            else:
                r = optim.lamb_trust_ratio(p, a, weight_decay)
            p.sub_(lr * r * u)
    return step


_LAMB_GRAD_RATIO = _lamb_variant(ratio_from="grad")
_LAMB_NO_GUARD = _lamb_variant(guard=False)
_LAMB_DECAY_OUTSIDE = _lamb_variant(decay_inside=False)
_LAMB_NO_BIAS_CORRECTION = _lamb_variant(bias_correction=False)
_LAMB_STATE_RESET = _lamb_variant(keep_state=False)

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
LAMB_STEP_MISTAKES = [(_LAMB_GRAD_RATIO, "gradient norm"), (_LAMB_NO_GUARD, "zero-norm guard"),
                      (_LAMB_DECAY_OUTSIDE, "weight decay outside the trust ratio"),
                      (_LAMB_NO_BIAS_CORRECTION, "no bias correction"), (_LAMB_STATE_RESET, "at every call")]
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


@code_exercise("lamb_step", solution=my_lamb_step, mistakes=LAMB_STEP_MISTAKES)
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
    mistakes = {LAMB_HINTS[k]: _lamb_run(f) for k, f in
                zip(("grad", "guard", "decay", "bias", "state"), (m for m, _ in LAMB_STEP_MISTAKES))}
    return diagnose(got, _lamb_run(_lamb_variant()), mistakes, rtol=1e-9, atol=1e-12,
                    what="the parameters after each of 4 LAMB steps")
