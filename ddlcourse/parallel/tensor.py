"""Tensor (intra-layer) parallelism in the style of Megatron-LM (Shoeybi et al., 2019).

A transformer MLP ``y = W2 gelu(W1 x)`` is split over the ``t`` ranks of a tensor-parallel group:

* :class:`ColumnParallelLinear` keeps rows ``[r*out/t, (r+1)*out/t)`` of ``W1`` (its output features):
  each rank computes its slice of ``W1 x``. Input replicated, output split. Backward: the input gradient
  is a *sum* over ranks of the partial products -> allreduce (the function ``f`` of the paper).
* :class:`RowParallelLinear` keeps columns of ``W2`` (its input features): each rank multiplies its slice
  of the hidden vector and the partial outputs are summed -> allreduce in forward (function ``g``),
  identity in backward.

So a column layer followed by a row layer needs one allreduce forward and one backward, and the
nonlinearity between them stays local. Layers are built from a serial ``nn.Linear`` so that the split
weights are exactly slices of the serial ones (the tests compare forward and backward).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from ddlcourse.parallel import traffic


def all_reduce_copy(x: torch.Tensor, group=None, count: str | None = None) -> torch.Tensor:
    """The sum of ``x`` over the group, in a new tensor; ``count``: also add the bytes this rank sends to
    :mod:`ddlcourse.parallel.traffic` under that kind."""
    x = x.contiguous().clone()
    if count is not None:
        t = tdist.get_world_size(group)
        traffic.add(count, traffic.ring_bytes("all_reduce", x.numel() * x.element_size(), t))
    tdist.all_reduce(x, group=group)
    return x


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, allreduce-sum of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, count=None):
        ctx.group, ctx.count = group, count
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return all_reduce_copy(g, ctx.group, ctx.count), None, None


class _ReduceFromTP(torch.autograd.Function):
    """g: allreduce-sum forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group, count=None):
        return all_reduce_copy(x, group, count)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


def copy_to_tp(x: torch.Tensor, group=None, count: str | None = None) -> torch.Tensor:
    """Megatron's f (before a column layer); ``count``: the traffic kind its backward all-reduce is counted as."""
    return _CopyToTP.apply(x, group, count)


def reduce_from_tp(x: torch.Tensor, group=None, count: str | None = None) -> torch.Tensor:
    """Megatron's g (after a row layer); ``count``: the traffic kind its forward all-reduce is counted as."""
    return _ReduceFromTP.apply(x, group, count)


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dim forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size(group))]
        tdist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx, g):
        r, t = tdist.get_rank(ctx.group), tdist.get_world_size(ctx.group)
        return g.chunk(t, -1)[r].contiguous(), None


def _shard(n: int, t: int, what: str) -> int:
    if n % t:
        raise ValueError(f"{what} {n} is not divisible by the tensor-parallel size {t}")
    return n // t


class ColumnParallelLinear(nn.Module):
    """This rank's output slice of ``linear``; ``gather_output=True`` all-gathers the full output."""

    def __init__(self, linear: nn.Linear, group=None, gather_output: bool = False):
        super().__init__()
        r, t = tdist.get_rank(group), tdist.get_world_size(group)
        k = _shard(linear.out_features, t, "out_features")
        self.weight = nn.Parameter(linear.weight.detach()[r * k:(r + 1) * k].clone())     # (out/t, in)
        self.bias = nn.Parameter(linear.bias.detach()[r * k:(r + 1) * k].clone()) if linear.bias is not None else None
        self.group, self.gather_output = group, gather_output

    def forward(self, x):                                  # x: (..., in) replicated
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)   # (..., out/t)
        return _GatherFromTP.apply(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's input slice of ``linear``; takes the split input of a column layer, returns the full output."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        r, t = tdist.get_rank(group), tdist.get_world_size(group)
        k = _shard(linear.in_features, t, "in_features")
        self.weight = nn.Parameter(linear.weight.detach()[:, r * k:(r + 1) * k].clone())  # (out, in/t)
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.group = group

    def forward(self, x_split):                            # x_split: (..., in/t)
        y = reduce_from_tp(F.linear(x_split, self.weight), self.group)       # (..., out): sum of partials
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    """``Linear -> GELU -> Linear`` split Megatron-style: column, local GELU, row. Built from a serial MLP."""

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, group=None):
        super().__init__()
        self.fc1, self.fc2 = ColumnParallelLinear(fc1, group), RowParallelLinear(fc2, group)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))

