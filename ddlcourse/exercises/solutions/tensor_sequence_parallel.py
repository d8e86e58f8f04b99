"""Reference solutions of notebooks/20_tensor_sequence_parallel.ipynb: the tensor-parallel MLP and the
sequence-parallel MLP, and each with one typical mistake (what its checker,
:mod:`ddlcourse.exercises.checkers.tensor_sequence_parallel`, must name)."""
import torch
import torch.distributed as tdist

from ddlcourse.selfcheck import reference


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


# The checker runs each of these on the ranks to name the learner's mistake (keyed as its _TP_HINTS); the fragments
# are those hints up to their first colon.
TP_VARIANTS = {kind: _tp_variant(kind) for kind in ("swapped", "both", "no_reduce", "bias", "f_identity")}

reference("tp_mlp", mistakes=[
    (TP_VARIANTS["swapped"], "f and g are swapped"),
    (TP_VARIANTS["both"], "g all-reduces in both directions"),
    (TP_VARIANTS["no_reduce"], "the row-parallel layer's output is a partial sum"),
    (TP_VARIANTS["bias"], "you added the bias b2 on every rank before the all-reduce, so the output has it world "
                          "times"),
    (TP_VARIANTS["f_identity"], "the input's gradient is a partial sum on each rank (each rank's hidden features "
                                "give part of it)")])(TPMLP)


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


# The checker runs each of these on the ranks to name the learner's mistake (keyed as its _SP_HINTS); the fragments
# are those hints up to their first colon or comma.
SP_VARIANTS = {kind: _sp_variant(kind) for kind in ("gather_bwd_slice", "scatter_bwd_mine", "no_sync", "sync_mean",
                                                    "bias_before")}

reference("sp_mlp", mistakes=[
    (SP_VARIANTS["gather_bwd_slice"], "the all-gather's backward kept only this rank's chunk of the gradient"),
    (SP_VARIANTS["scatter_bwd_mine"], "the reduce-scatter's backward gave my partial sum the gradient of my tokens "
                                      "only"),
    (SP_VARIANTS["no_sync"], "the norm's weights and fc2's bias saw only my tokens"),
    (SP_VARIANTS["sync_mean"], "sync_grads averaged the token-wise gradients"),
    (SP_VARIANTS["bias_before"], "you added fc2's bias before the reduce-scatter")])(SPMLP)
