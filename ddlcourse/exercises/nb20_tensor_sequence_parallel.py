"""Exercises of notebooks/20_tensor_sequence_parallel.ipynb."""
import numpy as np
import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- build it: the tensor-parallel MLP
class TPMLP(torch.nn.Module):
    """The MLP y = fc2(gelu(fc1(x))) split over the ranks as Megatron-LM splits it: fc1 by columns (rank r keeps
    hidden features r*k .. (r+1)*k - 1, k = hidden / world), fc2 by rows (the matching input features).
    ``self.fc1``: nn.Linear(dim, k), ``self.fc2``: nn.Linear(k, dim) whose bias is the whole b2, added once after
    the sum. ``f`` before the column layer, ``g`` after the row layer make forward and backward exact."""

    class CopyToTP(torch.autograd.Function):           # f: identity forward, all-reduce backward
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            import torch.distributed as tdist
            grad = grad.clone()
            tdist.all_reduce(grad)                         # each rank's hidden features give part of dL/dx
            return grad

    class ReduceFromTP(torch.autograd.Function):       # g: all-reduce forward, identity backward
        @staticmethod
        def forward(ctx, x):
            import torch.distributed as tdist
            x = x.clone()
            tdist.all_reduce(x)                            # the partial outputs add up to the output
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad                                    # every rank needs the whole gradient

    def __init__(self, fc1, fc2, rank, world):
        super().__init__()
        k = fc1.out_features // world
        mine = slice(rank * k, (rank + 1) * k)
        kw = dict(dtype=fc1.weight.dtype, device=fc1.weight.device)
        self.fc1 = torch.nn.Linear(fc1.in_features, k, **kw)
        self.fc2 = torch.nn.Linear(k, fc2.out_features, **kw)
        with torch.no_grad():
            self.fc1.weight.copy_(fc1.weight[mine])        # rows of W1: my output features
            self.fc1.bias.copy_(fc1.bias[mine])
            self.fc2.weight.copy_(fc2.weight[:, mine])     # columns of W2: the inputs that read them
            self.fc2.bias.copy_(fc2.bias)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(self.CopyToTP.apply(x)))
        y = self.ReduceFromTP.apply(torch.nn.functional.linear(h, self.fc2.weight))
        return y + self.fc2.bias                           # once, after the sum


def _tp_variant(kind: str):
    """TPMLP with one typical mistake: ``swapped`` (f and g swapped), ``both`` (g all-reduces in both
    directions), ``no_reduce`` (no all-reduce of the row layer's output), ``bias`` (b2 added on every rank
    before the sum), ``f_identity`` (f without its all-reduce in backward)."""
    import torch.distributed as tdist

    def reduce(t):
        t = t.clone()
        tdist.all_reduce(t)
        return t

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return reduce(x) if kind == "swapped" else x

        @staticmethod
        def backward(ctx, grad):
            return grad if kind in ("swapped", "f_identity") else reduce(grad)

    class G(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x if kind in ("swapped", "no_reduce") else reduce(x)

        @staticmethod
        def backward(ctx, grad):
            return reduce(grad) if kind in ("swapped", "both") else grad

    class Variant(TPMLP):
        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc1(F.apply(x)))
            if kind == "bias":
                return G.apply(self.fc2(h))
            return G.apply(torch.nn.functional.linear(h, self.fc2.weight)) + self.fc2.bias

    Variant.__name__ = Variant.__qualname__ = f"TPMLP_{kind}"
    return Variant


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


@code_exercise("tp_mlp", distributed=True, solution=TPMLP, ranks=(2, 3),
               mistakes=[(_tp_variant(k), h.split(":")[0]) for k, h in _TP_HINTS.items()])
def check_tp_mlp(cls, **_) -> Verdict:
    """On every rank: ``cls(fc1, fc2, rank, world)`` (see :class:`TPMLP`) must give the serial MLP's output and
    input gradient, and gradients of its shards ``self.fc1``, ``self.fc2`` equal to the slices of the serial
    gradients (with a fixed weighted sum of the output as the loss)."""
    import copy

    import torch.distributed as tdist

    info = dist.init(horovod=False)
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
    mistakes = {h: run(_tp_variant(kind)) for kind, h in _TP_HINTS.items()}
    v = diagnose(ans, ref, mistakes, rtol=1e-5, atol=1e-6,   # float32 shards pass too
                 what=f"rank {r}'s output, input gradient and shard gradients")
    return agreed(v)


# --------------------------------------------------------------------------- build it: the sequence-parallel MLP
class SPMLP(torch.nn.Module):
    """The sub-block x + fc2(gelu(fc1(ln(x)))) under tensor + sequence parallelism (Megatron-LM; Korthikanti et
    al. 2022). ``x``: (batch, s/t, dim), this rank's tokens (chunk ``rank`` of the sequence). The norm runs on my
    tokens with its whole weights; ``GatherSeq`` (all-gather the sequence forward, reduce-scatter the gradient
    backward) feeds the column layer; ``ScatterSeq`` (reduce-scatter forward, all-gather backward) follows the row
    layer's product; fc2's bias and the residual are added on my tokens. ``sync_grads`` sums over the ranks the
    gradients of the weights that saw only my tokens: the norm's and fc2's bias."""

    @staticmethod
    def _gather(x):                                        # every rank's tokens, in rank order (dim 1)
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def _scatter(x):                                       # the sum over the ranks, my chunk of the sequence
        chunks = [c.contiguous() for c in x.chunk(tdist.get_world_size(), dim=1)]
        out = torch.empty_like(chunks[0])
        tdist.reduce_scatter(out, chunks)
        return out

    class GatherSeq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return SPMLP._gather(x)

        @staticmethod
        def backward(ctx, grad):                           # every rank's hidden features read my tokens
            return SPMLP._scatter(grad)

    class ScatterSeq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return SPMLP._scatter(x)

        @staticmethod
        def backward(ctx, grad):                           # my partial sum reached every rank's tokens
            return SPMLP._gather(grad)

    def __init__(self, ln, fc1, fc2, rank, world):
        super().__init__()
        k = fc1.out_features // world
        mine = slice(rank * k, (rank + 1) * k)
        kw = dict(dtype=fc1.weight.dtype, device=fc1.weight.device)
        self.ln = torch.nn.LayerNorm(ln.normalized_shape, eps=ln.eps, **kw)
        self.fc1 = torch.nn.Linear(fc1.in_features, k, **kw)
        self.fc2 = torch.nn.Linear(k, fc2.out_features, **kw)
        with torch.no_grad():
            self.ln.load_state_dict(ln.state_dict())         # whole on every rank
            self.fc1.weight.copy_(fc1.weight[mine])
            self.fc1.bias.copy_(fc1.bias[mine])
            self.fc2.weight.copy_(fc2.weight[:, mine])
            self.fc2.bias.copy_(fc2.bias)

    def forward(self, x):
        h = self.GatherSeq.apply(self.ln(x))               # (batch, s, dim) on every rank
        h = torch.nn.functional.gelu(self.fc1(h))          # my hidden features of every token
        y = self.ScatterSeq.apply(torch.nn.functional.linear(h, self.fc2.weight))
        return x + y + self.fc2.bias                       # my tokens: the bias once, after the sum

    def sync_grads(self):
        for p in (self.ln.weight, self.ln.bias, self.fc2.bias):   # they saw only my tokens
            tdist.all_reduce(p.grad)


def _sp_variant(kind: str):
    """SPMLP with one typical mistake: ``gather_bwd_slice`` (the all-gather's backward keeps my chunk of the
    gradient instead of reduce-scattering it), ``scatter_bwd_mine`` (the reduce-scatter's backward puts my tokens'
    gradient in my chunk and zeros elsewhere instead of all-gathering), ``no_sync`` (no all-reduce of the
    token-wise weights' gradients), ``sync_mean`` (averaged instead of summed), ``bias_before`` (fc2's bias added
    before the reduce-scatter)."""

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return SPMLP._gather(x)

        @staticmethod
        def backward(ctx, grad):
            if kind == "gather_bwd_slice":
                return grad.chunk(tdist.get_world_size(), 1)[tdist.get_rank()].contiguous()
            return SPMLP._scatter(grad)

    class Scatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return SPMLP._scatter(x)

        @staticmethod
        def backward(ctx, grad):
            if kind == "scatter_bwd_mine":
                t, r = tdist.get_world_size(), tdist.get_rank()
                full = [torch.zeros_like(grad) for _ in range(t)]
                full[r] = grad
                return torch.cat(full, 1)
            return SPMLP._gather(grad)

    class Variant(SPMLP):
        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc1(Gather.apply(self.ln(x))))
            if kind == "bias_before":
                return x + Scatter.apply(self.fc2(h))
            return x + Scatter.apply(torch.nn.functional.linear(h, self.fc2.weight)) + self.fc2.bias

        def sync_grads(self):
            if kind == "no_sync":
                return
            super().sync_grads()
            if kind == "sync_mean":
                for p in (self.ln.weight, self.ln.bias, self.fc2.bias):
                    p.grad /= tdist.get_world_size()

    Variant.__name__ = Variant.__qualname__ = f"SPMLP_{kind}"
    return Variant


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


@code_exercise("sp_mlp", distributed=True, solution=SPMLP, ranks=(2, 3),
               mistakes=[(_sp_variant(k), h.split(":")[0].split(",")[0]) for k, h in _SP_HINTS.items()])
def check_sp_mlp(cls, **_) -> Verdict:
    """On every rank: ``cls(ln, fc1, fc2, rank, world)`` (see :class:`SPMLP`) on this rank's tokens must give the
    serial sub-block's output and input gradient for those tokens; after ``sync_grads()`` the norm's and fc2's
    bias gradients equal the serial ones and the shards' gradients equal the slices of the serial ones (with a
    fixed weighted sum of the output as the loss)."""
    import copy

    info = dist.init(horovod=False)
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
    mistakes = {h: run(_sp_variant(kind)) for kind, h in _SP_HINTS.items()}
    v = diagnose(ans, ref, mistakes, rtol=1e-5, atol=1e-6,
                 what=f"rank {r}'s output and input gradient on its tokens, and the parameters' gradients")
    return agreed(v)
