"""Exercises of notebooks/07_large_batch.ipynb."""
import math

from ddlcourse.selfcheck import code_exercise, diagnose, exercise


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
    import torch

    g = torch.Generator().manual_seed(7)
    out = []
    for shape, w_scale, g_scale in (((16, 8), 1.0, 0.01), ((8,), 0.1, 1.0), ((4, 4, 3), 3.0, 0.2), ((5,), 0.5, 5.0)):
        out.append((torch.randn(*shape, generator=g, dtype=torch.float64) * w_scale,
                    torch.randn(*shape, generator=g, dtype=torch.float64) * g_scale,
                    torch.randn(*shape, generator=g, dtype=torch.float64)))
    return out


def _norm(t):
    import torch
    return float(torch.linalg.vector_norm(t))


@code_exercise("lars_trust_ratio")
def check_lars_trust_ratio(fn, **_):
    """``fn(weight, grad, eta, weight_decay) -> float`` against ``optim.lars_trust_ratio`` on four layers."""
    from ddlcourse import optim

    eta, wd = 0.02, 0.01
    layers = _layers()

    def ratios(f):
        return [float(f(w.clone(), g.clone(), eta, wd)) for w, g, _ in layers]

    mistakes = {
        "you left out the weight decay term: the denominator is ||g|| + weight_decay * ||w||":
            ratios(lambda w, g, e, d: e * _norm(w) / _norm(g)),
        "you left out the trust coefficient eta: multiply by eta":
            ratios(lambda w, g, e, d: _norm(w) / (_norm(g) + d * _norm(w))),
        "your ratio is upside down: the weight norm goes on top, eta * ||w|| / (||g|| + weight_decay * ||w||)":
            ratios(lambda w, g, e, d: e * (_norm(g) + d * _norm(w)) / _norm(w)),
        "you used squared norms (sums of squares): take the square root, torch.linalg.vector_norm":
            ratios(lambda w, g, e, d: e * _norm(w) ** 2 / (_norm(g) ** 2 + d * _norm(w) ** 2)),
    }
    v = diagnose(ratios(fn), ratios(optim.lars_trust_ratio), mistakes, rtol=1e-8, atol=1e-12,
                 what="the trust ratios of the four layers")
    if v.ok:   # a zero-initialised layer (a bias at step 0): the ratio must not be 0 or NaN
        import torch
        z = torch.zeros(5, dtype=torch.float64)
        r = float(fn(z, torch.ones(5, dtype=torch.float64), eta, wd))
        v = diagnose(r, optim.lars_trust_ratio(z, torch.ones(5, dtype=torch.float64), eta, wd),
                     {"a zero weight gives ratio 0, so the layer never moves: return 1 when ||w|| is 0": 0.0},
                     what="the ratio of an all-zero weight")
    return v


@code_exercise("lamb_trust_ratio")
def check_lamb_trust_ratio(fn, **_):
    """``fn(weight, adam_step, weight_decay) -> float`` against ``optim.lamb_trust_ratio`` on four layers."""
    from ddlcourse import optim

    wd = 0.01
    layers = _layers()

    def ratios(f):
        return [float(f(w.clone(), u.clone(), wd)) for w, _, u in layers]

    mistakes = {
        "you left out the weight decay: the update is u = adam_step + weight_decay * w, and the ratio is ||w|| / ||u||":
            ratios(lambda w, u, d: _norm(w) / _norm(u)),
        "your ratio is upside down: ||w|| / ||adam_step + weight_decay * w||":
            ratios(lambda w, u, d: _norm(u + d * w) / _norm(w)),
        "you used squared norms (sums of squares): take the square root, torch.linalg.vector_norm":
            ratios(lambda w, u, d: _norm(w) ** 2 / _norm(u + d * w) ** 2),
    }
    v = diagnose(ratios(fn), ratios(optim.lamb_trust_ratio), mistakes, rtol=1e-8, atol=1e-12,
                 what="the trust ratios of the four layers")
    if v.ok:
        import torch
        z = torch.zeros(5, dtype=torch.float64)
        r = float(fn(z, torch.ones(5, dtype=torch.float64), wd))
        v = diagnose(r, optim.lamb_trust_ratio(z, torch.ones(5, dtype=torch.float64), wd),
                     {"a zero weight gives ratio 0, so the layer never moves: return 1 when ||w|| is 0": 0.0},
                     what="the ratio of an all-zero weight")
    return v
