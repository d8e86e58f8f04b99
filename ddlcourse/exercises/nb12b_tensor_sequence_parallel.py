"""Exercises of notebooks/12b_tensor_sequence_parallel.ipynb."""
import numpy as np
import torch

from ddlcourse.selfcheck import Verdict, code_exercise, diagnose


def _inputs(r, t):
    """This rank's partial output of a row-parallel layer: (batch, seq, dim)."""
    import torch

    g = torch.Generator().manual_seed(40 + r)
    n = 2 * t
    return torch.randn(n, n, 3, generator=g, dtype=torch.float64)


def _gathered(x):
    """Every rank's ``x`` (collective), in rank order."""
    import torch
    import torch.distributed as tdist

    parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, x.contiguous())
    return parts


# typical mistakes (each returns what that wrong code would give on this rank)
def _no_sum(x, group=None):
    import torch.distributed as tdist
    return x.chunk(tdist.get_world_size(group), 1)[tdist.get_rank(group)]


def _wrong_dim(x, group=None):
    import torch.distributed as tdist
    total = sum(_gathered(x))
    return total.chunk(tdist.get_world_size(group), 0)[tdist.get_rank(group)]


def _mean(x, group=None):
    import torch.distributed as tdist
    t = tdist.get_world_size(group)
    return (sum(_gathered(x)) / t).chunk(t, 1)[tdist.get_rank(group)]


def _wrong_chunk(x, group=None):
    import torch.distributed as tdist
    t, r = tdist.get_world_size(group), tdist.get_rank(group)
    return sum(_gathered(x)).chunk(t, 1)[(r + 1) % t]



def check_reduce_scatter(fn, **_):
    """On every rank: ``fn(partial, group) -> this rank's slice, along the sequence (dim 1), of the sum of every
    rank's ``partial``, against :func:`ddlcourse.parallel.sequence.reduce_scatter_seq`."""
    from ddlcourse import dist
    from ddlcourse.parallel import sequence

    dist.init(horovod=False)
    r, t = dist.rank(), dist.world_size()
    x = _inputs(r, t)
    ref = np.asarray(sequence.reduce_scatter_seq(x.clone(), None))
    ans = fn(x.clone(), None)
    ans = np.asarray(ans.detach() if hasattr(ans, "detach") else ans, dtype=float)
    # every rank computes every wrong variant (they are collectives) before any verdict
    wrong_dim = np.asarray(_wrong_dim(x.clone()))
    mistakes = {
        "you sliced without summing: the row layer's outputs are partial sums, reduce them over the ranks first":
            np.asarray(_no_sum(x.clone())),
        "you averaged the partial outputs: a row-parallel layer's partials add up to the output, sum them":
            np.asarray(_mean(x.clone())),
        "you kept another rank's slice: rank r keeps chunk r of the sequence": np.asarray(_wrong_chunk(x.clone())),
    }
    if ans.shape == tuple(x.shape) and t > 1:
        return Verdict(False, "you returned the whole sum (an all-reduce): keep only this rank's slice of the "
                              "sequence, chunk `rank` of dim 1 -- that is what sequence parallelism saves")
    if ans.shape == wrong_dim.shape != ref.shape and np.allclose(ans, wrong_dim):
        return Verdict(False, "you split along the batch (dim 0): sequence parallelism splits the sequence, dim 1")
    return diagnose(ans, np.asarray(ref), mistakes,
                    what="this rank's slice of the summed output")


def reduce_scatter_seq(partial, group=None):
    """partial: (batch, seq, dim), this rank's partial sum. Return (batch, seq/t, dim): my tokens of the sum."""
    import torch
    import torch.distributed as tdist
    t = tdist.get_world_size(group)
    chunks = [c.contiguous() for c in partial.chunk(t, dim=1)]    # chunk i: the tokens of rank i
    out = torch.empty_like(chunks[0])
    tdist.reduce_scatter(out, chunks, group=group)                 # rank r receives the sum of every chunk r
    return out


def _all_reduce_only(x, group=None):
    import torch.distributed as tdist
    x = x.clone()
    tdist.all_reduce(x, group=group)
    return x


code_exercise("sp_reduce_scatter", distributed=True, solution=reduce_scatter_seq, ranks=(2, 3), mistakes=[
    (_no_sum, "without summing"), (_mean, "averaged"), (_wrong_chunk, "another rank"), (_wrong_dim, "dim 0"),
    (_all_reduce_only, "whole sum")])(check_reduce_scatter)


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

    from ddlcourse import dist
    from ddlcourse.exercises.nb12_tensor_spatial_sharded import _agreed
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
        return _agreed(Verdict(False, ans))
    mistakes = {h: run(_tp_variant(kind)) for kind, h in _TP_HINTS.items()}
    v = diagnose(ans, ref, mistakes, rtol=1e-5, atol=1e-6,   # float32 shards pass too
                 what=f"rank {r}'s output, input gradient and shard gradients")
    return _agreed(v)
