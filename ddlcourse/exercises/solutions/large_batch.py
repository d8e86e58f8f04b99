"""Reference solutions of notebooks/12_large_batch.ipynb: the LARS and LAMB trust ratios and the whole LAMB step as a
learner writes them, and each with one typical mistake (what their checkers,
:mod:`ddlcourse.exercises.checkers.large_batch`, must name)."""
import torch

from ddlcourse import optim
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercises: trust ratios
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


LARS_VARIANTS = {"no_decay": _lars_no_decay, "no_eta": _lars_no_eta, "upside_down": _lars_upside_down,
                 "squared": _lars_squared, "no_guard": _lars_no_guard}

reference("lars_trust_ratio", mistakes=[
    (_lars_no_decay, "left out the weight decay term"), (_lars_no_eta, "trust coefficient eta"),
    (_lars_upside_down, "upside down"), (_lars_squared, "squared norms"), (_lars_no_guard, "never moves")])(
    my_lars_trust_ratio)


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


LAMB_RATIO_VARIANTS = {"no_decay": _lamb_ratio_no_decay, "upside_down": _lamb_ratio_upside_down,
                       "squared": _lamb_ratio_squared, "no_guard": _lamb_ratio_no_guard}

reference("lamb_trust_ratio", mistakes=[
    (_lamb_ratio_no_decay, "left out the weight decay"), (_lamb_ratio_upside_down, "upside down"),
    (_lamb_ratio_squared, "squared norms"), (_lamb_ratio_no_guard, "never moves")])(my_lamb_trust_ratio)


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


LAMB_VARIANTS = {"grad": _lamb_variant(ratio_from="grad"), "guard": _lamb_variant(guard=False),
                 "decay": _lamb_variant(decay_inside=False), "bias": _lamb_variant(bias_correction=False),
                 "state": _lamb_variant(keep_state=False)}

reference("lamb_step", mistakes=[
    (LAMB_VARIANTS["grad"], "gradient norm"), (LAMB_VARIANTS["guard"], "zero-norm guard"),
    (LAMB_VARIANTS["decay"], "weight decay outside the trust ratio"),
    (LAMB_VARIANTS["bias"], "no bias correction"), (LAMB_VARIANTS["state"], "at every call")])(my_lamb_step)
