"""Checkers of notebooks/20_tensor_sequence_parallel.ipynb: the tensor-parallel MLP and the sequence-parallel MLP
the learner builds, against the serial MLP (their references and typical mistakes are in
:mod:`ddlcourse.exercises.solutions.tensor_sequence_parallel`)."""
import numpy as np
import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.exercises.solutions.tensor_sequence_parallel import SP_VARIANTS, TP_VARIANTS
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- build it: the tensor-parallel MLP
_TP_HINTS = {
    "swapped": "f and g are swapped: f (before the column layer) is the identity forward and all-reduces the "
               "gradient backward; g (after the row layer) all-reduces forward and is the identity backward",
    "both": "g all-reduces in both directions: its backward is the identity (every rank already has the whole "
            "gradient of the output), so the parameters' gradients came out world times too large",
    "no_reduce": "the row-parallel layer's output is a partial sum: all-reduce it (g's forward) before adding "
                 "the bias",
    "bias": "you added the bias b2 on every rank before the all-reduce, so the output has it world times: add "
            "it once, after the sum",
    "f_identity": "the input's gradient is a partial sum on each rank (each rank's hidden features give part of "
                  "it): f's backward must all-reduce it",
}


@code_exercise("tp_mlp", distributed=True, ranks=(2, 3))
def check_tp_mlp(cls, **_) -> Verdict:
    """On every rank: ``cls(fc1, fc2, rank, world)`` (see
    :class:`ddlcourse.exercises.solutions.tensor_sequence_parallel.TPMLP`) must give the serial MLP's output and
    input gradient, and gradients of its shards ``self.fc1``, ``self.fc2`` equal to the slices of the serial
    gradients (with a fixed weighted sum of the output as the loss)."""
    import copy

    import torch.distributed as tdist

    info = dist.init()
    r, t = tdist.get_rank(), tdist.get_world_size()
    dim, k = 5, 4                                          # hidden = 4 * world: k features per rank
    g = torch.Generator().manual_seed(41)
    fc1, fc2 = torch.nn.Linear(dim, k * t), torch.nn.Linear(k * t, dim)
    with torch.no_grad():
        for q in list(fc1.parameters()) + list(fc2.parameters()):
            q.copy_(torch.randn(q.shape, generator=g))
    fc1, fc2 = fc1.to(info.device, torch.float64), fc2.to(info.device, torch.float64)
    x = torch.randn(3, dim, generator=g, dtype=torch.float64).to(info.device)
    wts = torch.randn(3, dim, generator=g, dtype=torch.float64).to(info.device)
    mine = slice(r * k, (r + 1) * k)

    def flat(*ts):
        return np.concatenate([np.asarray(u.detach().cpu(), dtype=float).reshape(-1) for u in ts])

    xs = x.clone().requires_grad_(True)
    s1, s2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    y = s2(torch.nn.functional.gelu(s1(xs)))
    (y * wts).sum().backward()
    ref = flat(y, xs.grad, s1.weight.grad[mine], s1.bias.grad[mine], s2.weight.grad[:, mine], s2.bias.grad)

    def run(c):
        m = c(copy.deepcopy(fc1), copy.deepcopy(fc2), r, t)
        if not all(isinstance(getattr(m, a, None), torch.nn.Linear) for a in ("fc1", "fc2")):
            return "keep your shards as self.fc1 (the column layer) and self.fc2 (the row layer), nn.Linear each"
        xi = x.clone().requires_grad_(True)
        out = m(xi)
        (out * wts).sum().backward()
        grads = [u.grad if u.grad is not None else torch.zeros_like(u)
                 for u in (xi, m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias)]
        return flat(out, *grads)

    ans = run(cls)
    if isinstance(ans, str):
        return agreed(Verdict(False, ans))
    mistakes = {h: run(TP_VARIANTS[kind]) for kind, h in _TP_HINTS.items()}
    v = diagnose(ans, ref, mistakes, rtol=1e-5, atol=1e-6,   # float32 shards pass too
                 what=f"rank {r}'s output, input gradient and shard gradients")
    return agreed(v)


# --------------------------------------------------------------------------- build it: the sequence-parallel MLP
_SP_HINTS = {
    "gather_bwd_slice": "the all-gather's backward kept only this rank's chunk of the gradient: every rank's "
                        "hidden features read my tokens, so the gradient of my tokens is a sum over the ranks -- "
                        "reduce-scatter it",
    "scatter_bwd_mine": "the reduce-scatter's backward gave my partial sum the gradient of my tokens only: it went "
                        "into every rank's tokens, so all-gather the gradient",
    "no_sync": "the norm's weights and fc2's bias saw only my tokens, so their gradients are partial sums: "
               "sync_grads must all-reduce them",
    "sync_mean": "sync_grads averaged the token-wise gradients: the loss sums over every rank's tokens, so sum "
                 "them (all-reduce without dividing)",
    "bias_before": "you added fc2's bias before the reduce-scatter, so my tokens got it world times: add it once, "
                   "after the sum",
}


@code_exercise("sp_mlp", distributed=True, ranks=(2, 3))
def check_sp_mlp(cls, **_) -> Verdict:
    """On every rank: ``cls(ln, fc1, fc2, rank, world)`` (see
    :class:`ddlcourse.exercises.solutions.tensor_sequence_parallel.SPMLP`) on this rank's tokens must give the
    serial sub-block's output and input gradient for those tokens; after ``sync_grads()`` the norm's and fc2's
    bias gradients equal the serial ones and the shards' gradients equal the slices of the serial ones (with a
    fixed weighted sum of the output as the loss)."""
    import copy

    info = dist.init()
    r, t = tdist.get_rank(), tdist.get_world_size()
    dim, k, per, batch = 6, 4, 2, 3                        # hidden = 4 * world, 2 tokens per rank
    g = torch.Generator().manual_seed(43)
    ln, fc1, fc2 = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, k * t), torch.nn.Linear(k * t, dim)
    with torch.no_grad():
        for q in [*ln.parameters(), *fc1.parameters(), *fc2.parameters()]:
            q.copy_(torch.randn(q.shape, generator=g))
    ln, fc1, fc2 = (m.to(info.device, torch.float64) for m in (ln, fc1, fc2))
    x = torch.randn(batch, per * t, dim, generator=g, dtype=torch.float64).to(info.device)
    wts = torch.randn(batch, per * t, dim, generator=g, dtype=torch.float64).to(info.device)
    tok, hid = slice(r * per, (r + 1) * per), slice(r * k, (r + 1) * k)

    def flat(*ts):
        return np.concatenate([np.asarray(u.detach().cpu(), dtype=float).reshape(-1) for u in ts])

    xs = x.clone().requires_grad_(True)
    s0, s1, s2 = copy.deepcopy(ln), copy.deepcopy(fc1), copy.deepcopy(fc2)
    y = xs + s2(torch.nn.functional.gelu(s1(s0(xs))))
    (y * wts).sum().backward()
    ref = flat(y[:, tok], xs.grad[:, tok], s0.weight.grad, s0.bias.grad, s1.weight.grad[hid], s1.bias.grad[hid],
               s2.weight.grad[:, hid], s2.bias.grad)

    def run(c):
        m = c(copy.deepcopy(ln), copy.deepcopy(fc1), copy.deepcopy(fc2), r, t)
        if not (isinstance(getattr(m, "ln", None), torch.nn.LayerNorm)
                and all(isinstance(getattr(m, a, None), torch.nn.Linear) for a in ("fc1", "fc2"))):
            return "keep the norm as self.ln (nn.LayerNorm) and the shards as self.fc1 and self.fc2 (nn.Linear)"
        xi = x[:, tok].clone().requires_grad_(True)
        out = m(xi)
        if tuple(out.shape) != tuple(xi.shape):
            return (f"your forward returned shape {tuple(out.shape)} for my tokens {tuple(xi.shape)}: the output "
                    "stays on my tokens (the reduce-scatter keeps chunk `rank` of the sequence)")
        (out * wts[:, tok]).sum().backward()
        m.sync_grads()
        params = (m.ln.weight, m.ln.bias, m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias)
        return flat(out, *[u.grad if u.grad is not None else torch.zeros_like(u) for u in (xi, *params)])

    ans = run(cls)
    if isinstance(ans, str):
        return agreed(Verdict(False, ans))
    mistakes = {h: run(SP_VARIANTS[kind]) for kind, h in _SP_HINTS.items()}
    v = diagnose(ans, ref, mistakes, rtol=1e-5, atol=1e-6,
                 what=f"rank {r}'s output and input gradient on its tokens, and the parameters' gradients")
    return agreed(v)
