"""Tensor and sequence parallelism of a transformer block (notebook 20 · tensor and sequence parallelism).

Megatron-LM (Shoeybi et al. 2019) splits a block over the ``t`` ranks of a tensor-parallel group:

* attention: ``wq, wk, wv`` by *columns* (rank r keeps heads ``r*h/t .. (r+1)*h/t - 1``, each rank runs the
  same attention code on its heads), ``wo`` by *rows* (each rank multiplies its heads' output: partial sums);
* MLP: ``fc1`` by columns (local GELU), ``fc2`` by rows.

Two conjugate collectives make it exact, forward and backward (the autograd functions of
:mod:`ddlcourse.parallel.tensor`, here counting their bytes):

    f = copy_to_tp      identity forward,  all-reduce backward     (before a column layer: input replicated)
    g = reduce_from_tp  all-reduce forward, identity backward       (after a row layer: sum the partials)

Sequence parallelism (Korthikanti et al. 2022) notices that the all-reduce of ``g`` is a reduce-scatter
followed by an all-gather, and moves the all-gather to just before the next column layer. In between (the
LayerNorms, the residual adds, dropout) each rank holds only ``s/t`` of the tokens:

    g  -> reduce_scatter_seq   reduce-scatter forward (sum the partials, keep my tokens), all-gather backward
    f  -> gather_seq           all-gather forward (the whole sequence for the column layer), reduce-scatter backward

The same bytes move (an all-reduce = reduce-scatter + all-gather), but the norms' activations shrink by ``t``.
Parameters used on only a shard of the tokens (the norms, the row layers' biases) get *partial* gradients
under sequence parallelism: :func:`sync_sequence_parallel_grads` all-reduces them.

Every collective adds what this rank sends to :mod:`ddlcourse.parallel.traffic` (kind ``"tp"``).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from ddlcourse import grid
from ddlcourse.device import rank_device
from ddlcourse.parallel import tensor, traffic


def _size_rank(group):
    return tdist.get_world_size(group), tdist.get_rank(group)


def _all_reduce(x, group):
    return tensor.all_reduce_copy(x, group, count="tp")


def _all_gather_seq(x, group, dim=1):
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    t, _ = _size_rank(group)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(t)]
    traffic.add("tp", traffic.ring_bytes("all_gather", x.numel() * x.element_size() * t, t))
    tdist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim)


def _reduce_scatter_seq(x, group, dim=1):
    """Sum ``x`` over the ranks and keep this rank's ``1/t`` slice along ``dim``."""
    t, _ = _size_rank(group)
    if x.shape[dim] % t:
        raise ValueError(f"sequence length {x.shape[dim]} is not divisible by the tensor-parallel size {t}")
    chunks = [c.contiguous() for c in x.chunk(t, dim)]
    out = torch.empty_like(chunks[0])
    traffic.add("tp", traffic.ring_bytes("reduce_scatter", x.numel() * x.element_size(), t))
    tdist.reduce_scatter(out, chunks, group=group)
    return out


class _GatherSeq(torch.autograd.Function):
    """SP's f: all-gather the sequence forward; reduce-scatter the gradient backward."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group), None


class _ReduceScatterSeq(torch.autograd.Function):
    """SP's g: reduce-scatter along the sequence forward; all-gather the gradient backward."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group), None


class _SplitSeq(torch.autograd.Function):
    """Enter a sequence-parallel region from a replicated tensor: keep my slice; backward all-gathers."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t, r = _size_rank(group)
        return x.chunk(t, 1)[r].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group), None


class _GatherSeqReplicated(torch.autograd.Function):
    """Leave a sequence-parallel region into replicated code (every rank computes the same from the whole
    sequence, so every rank has the whole gradient): all-gather forward, keep my slice backward."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        t, r = _size_rank(ctx.group)
        return grad.chunk(t, 1)[r].contiguous(), None


def copy_to_tp(x, group=None):
    """f: identity forward; all-reduce of the input gradient backward (:func:`ddlcourse.parallel.tensor.copy_to_tp`,
    counted as ``"tp"`` traffic)."""
    return tensor.copy_to_tp(x, group, count="tp")


def reduce_from_tp(x, group=None):
    """g: all-reduce forward (sum the row layer's partial outputs); identity backward (counted as ``"tp"``)."""
    return tensor.reduce_from_tp(x, group, count="tp")


def gather_seq(x, group=None):
    return _GatherSeq.apply(x, group)


def reduce_scatter_seq(x, group=None):
    return _ReduceScatterSeq.apply(x, group)


def split_seq(x, group=None):
    return _SplitSeq.apply(x, group)


def gather_seq_replicated(x, group=None):
    return _GatherSeqReplicated.apply(x, group)


# --------------------------------------------------------------------------- the parallel block
def _cols(linear: nn.Linear, r: int, t: int) -> nn.Linear:
    """Rows ``r/t`` of the weight (output features ``r*out/t ..``) and of the bias: a column-parallel shard."""
    if linear.out_features % t:
        raise ValueError(f"out_features {linear.out_features} is not divisible by the tensor-parallel size {t}")
    k = linear.out_features // t
    out = nn.Linear(linear.in_features, k, device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[r * k:(r + 1) * k])
        out.bias.copy_(linear.bias[r * k:(r + 1) * k])
    return out


def _rows(linear: nn.Linear, r: int, t: int) -> tuple[nn.Linear, nn.Parameter]:
    """Columns ``r/t`` of the weight (input features), without bias; the bias, whole, is returned apart
    (it is added once, after the partial sums are reduced)."""
    if linear.in_features % t:
        raise ValueError(f"in_features {linear.in_features} is not divisible by the tensor-parallel size {t}")
    k = linear.in_features // t
    out = nn.Linear(k, linear.out_features, bias=False, device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, r * k:(r + 1) * k])
    return out, nn.Parameter(linear.bias.detach().clone())


class TensorParallelBlock(nn.Module):
    """This rank's share of a serial :class:`ddlcourse.models.transformer.Block`.

    ``sp=False``: ``forward(x, pos)`` takes and returns the whole sequence, replicated on every rank.
    ``sp=True``: it takes and returns this rank's ``s/t`` tokens (``x.chunk(t, dim=1)[rank]``); ``pos`` are
    the positions of the *whole* sequence (attention runs on the gathered sequence).
    """
    def __init__(self, block, group=None, sp: bool = False):
        super().__init__()
        t, r = _size_rank(group)
        n_heads = block.attn.wq.out_features // block.attn.head_dim
        if n_heads % t:
            raise ValueError(f"{n_heads} heads do not split over {t} tensor-parallel ranks")
        self.group, self.sp, self.t = group, sp, t
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.head_dim, self.attn_fn = block.attn.head_dim, block.attn.attn_fn
        self.wq, self.wk, self.wv = (_cols(lin, r, t) for lin in (block.attn.wq, block.attn.wk, block.attn.wv))
        self.wo, self.wo_bias = _rows(block.attn.wo, r, t)
        self.fc1 = _cols(block.mlp.fc1, r, t)
        self.fc2, self.fc2_bias = _rows(block.mlp.fc2, r, t)
        # whole on every rank (the others are shards); under sp used on this rank's tokens only, so their
        # gradients are partial sums over the ranks until sync_sequence_parallel_grads
        for p in (*self.ln1.parameters(), *self.ln2.parameters(), self.wo_bias, self.fc2_bias):
            p.sequence_parallel = sp
            p.tp_replicated = True

    def _enter(self, h):    # before the column layers: the whole sequence, replicated
        return gather_seq(h, self.group) if self.sp else copy_to_tp(h, self.group)

    def _leave(self, y):    # after the row layers: sum the partial outputs (and keep my tokens under sp)
        return reduce_scatter_seq(y, self.group) if self.sp else reduce_from_tp(y, self.group)

    def attention(self, x, pos):
        h = self._enter(self.ln1(x))                                          # (B, s, dim)
        B, T, _ = h.shape

        def heads(z):                                                         # (B, T, dim/t) -> (B, h/t, T, hd)
            return z.view(B, T, -1, self.head_dim).transpose(1, 2)

        o = self.attn_fn(heads(self.wq(h)), heads(self.wk(h)), heads(self.wv(h)), pos, pos)
        return self._leave(self.wo(o.transpose(1, 2).reshape(B, T, -1))) + self.wo_bias

    def mlp(self, x):
        h = self._enter(self.ln2(x))
        return self._leave(self.fc2(F.gelu(self.fc1(h)))) + self.fc2_bias

    def forward(self, x, pos):
        x = x + self.attention(x, pos)
        return x + self.mlp(x)


def sync_sequence_parallel_grads(module: nn.Module, group=None) -> None:
    """All-reduce the gradients of the parameters that saw only this rank's tokens (sequence parallelism)."""
    grads = [p.grad for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if grads:
        flat = _all_reduce(torch.cat([g.reshape(-1) for g in grads]), group)
        i = 0
        for g in grads:
            g.copy_(flat[i:i + g.numel()].view_as(g))
            i += g.numel()


def clip_grad_norm_tp(module: nn.Module, max_norm: float, group=None) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a tensor-parallel module: the serial model's gradient norm, and every
    gradient scaled by ``min(1, max_norm / norm)`` on every rank alike.

    A rank holds shards of most weights and the whole of a few (``p.tp_replicated``: the norms, the row layers'
    biases). The global squared norm is the shards' squared norms summed over the ranks (an all-reduce of one
    number) plus the replicated weights' once, not ``t`` times. Call it after :func:`sync_sequence_parallel_grads`.
    Megatron-LM does the same (``param_is_not_tensor_parallel_duplicate`` in its grad-norm code).
    """
    params = [p for p in module.parameters() if p.grad is not None]
    shards = [p.grad.double().square().sum() for p in params if not getattr(p, "tp_replicated", False)]
    whole = [p.grad.double().square().sum() for p in params if getattr(p, "tp_replicated", False)]
    sq = torch.stack(shards).sum() if shards else torch.zeros((), dtype=torch.float64, device=params[0].grad.device)
    tdist.all_reduce(sq, group=group)
    if whole:
        sq = sq + torch.stack(whole).sum()
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef.to(p.grad.dtype))
    return norm


class TensorParallelTransformer(nn.Module):
    """A serial :class:`ddlcourse.models.transformer.Transformer` with every block tensor parallel.

    Embeddings, the final norm and the head are replicated (every rank computes them); with ``sp`` the
    residual stream between them is split along the sequence. ``forward(idx) -> logits`` (whole, replicated).
    """
    def __init__(self, model, group=None, sp: bool = False):
        super().__init__()
        self.group, self.sp, self.cfg = group, sp, model.cfg
        self.tok_emb, self.pos_emb = copy.deepcopy(model.tok_emb), copy.deepcopy(model.pos_emb)
        self.blocks = nn.ModuleList(TensorParallelBlock(b, group, sp) for b in model.blocks)
        self.ln_f, self.head = copy.deepcopy(model.ln_f), copy.deepcopy(model.head)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        if self.sp:
            x = split_seq(x, self.group)
        for b in self.blocks:
            x = b(x, pos)
        if self.sp:
            x = gather_seq_replicated(x, self.group)
        return self.head(self.ln_f(x))

    def sync_grads(self):
        sync_sequence_parallel_grads(self, self.group)


# --------------------------------------------------------------------------- the same with DTensor
def _mesh(group, device):
    return grid.device_mesh_of(group, torch.device(device).type)


def dtensor_block(block, group=None, sp: bool = False, device=None):
    """A copy of ``block`` parallelised with ``torch.distributed.tensor.parallel.parallelize_module``:
    ``wq, wk, wv, fc1`` ColwiseParallel, ``wo, fc2`` RowwiseParallel; with ``sp`` the norms are
    SequenceParallel, the attention and MLP inputs are all-gathered (PrepareModuleInput) and the row layers
    reduce-scatter (``output_layouts=Shard(1)``). Returns ``(module, mesh)``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    mesh = _mesh(group, rank_device(device))
    block = copy.deepcopy(block)
    if not sp:
        plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
                "attn.wo": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    else:
        gather = PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None),
                                    use_local_output=True)
        plan = {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                "attn": gather, "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(output_layouts=Shard(1),
                                                                         use_local_output=False),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                          use_local_output=True),
                "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1),
                                                                         use_local_output=False)}
    return parallelize_module(block, mesh, plan), mesh


__all__ = ["copy_to_tp", "reduce_from_tp", "gather_seq", "reduce_scatter_seq", "split_seq", "gather_seq_replicated",
           "TensorParallelBlock", "TensorParallelTransformer", "sync_sequence_parallel_grads", "dtensor_block"]
