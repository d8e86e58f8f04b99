"""Expert parallelism: a mixture of experts whose experts live on different ranks (notebook 22 · expert parallelism).

The ``ep`` ranks of a group each hold ``n_experts / ep`` experts and their own tokens (a shard of the batch).
One MoE layer on a rank (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021)::

    experts, gates, keep, aux = route(router(x), top_k, capacity)   # capacity per expert, for this rank's tokens
    sort the kept (token, choice) pairs by expert                    # experts of rank 0 first, then rank 1, ...
    counts  = all_to_all(tokens per expert)                          # how many rows each rank will receive
    recv    = all_to_all(x[kept tokens])                             # dispatch: uneven splits
    out_e   = expert_e(recv rows of e)                               # local experts on what arrived
    back    = all_to_all(out_e)                                      # combine: the reverse exchange
    y[token] += gate * back                                          # dropped choices add nothing

Both exchanges are autograd functions: their backward is the reverse all_to_all. With ``n_groups = ep``
the serial :class:`ddlcourse.models.transformer.MoE` routes each rank's tokens as one group with the same
capacity, so the two compute the same thing (:func:`compare_with_serial`).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as tdist
from torch import nn

from ddlcourse.models.transformer import MoE, expert_capacity, route
from ddlcourse.parallel import traffic


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` split by ``in_splits`` go to ranks 0..n-1; ``out_splits`` rows come from each. Backward: reverse."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        return _exchange(g, in_splits, out_splits, ctx.group), None, None, None


def _exchange(x, out_splits, in_splits, group):
    x = x.contiguous()
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    me = tdist.get_rank(group)
    row = x[0].numel() * x.element_size() if x.dim() > 1 else x.element_size()
    traffic.add("all_to_all", row * (sum(in_splits) - in_splits[me]))   # rows for other ranks only
    tdist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return out


def all_to_all(x, out_splits: list[int], in_splits: list[int], group=None) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` with uneven splits along dim 0."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


class ExpertParallelMoE(nn.Module):
    """This rank's share of a serial :class:`MoE`: the router (replicated) and experts
    ``[rank * E/ep, (rank+1) * E/ep)``. ``forward(x)`` takes this rank's tokens, (..., dim).

    After a forward: ``aux`` (this rank's load-balancing loss), ``stats`` with ``load`` (tokens each *local*
    expert received from all ranks), ``dropped`` (this rank's dropped choices) and ``sent`` (rows it sent
    to each rank).
    """

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        self.group = group
        self.ep, self.rank = tdist.get_world_size(group), tdist.get_rank(group)
        self.n_experts = len(moe.experts)
        if self.n_experts % self.ep:
            raise ValueError(f"{self.n_experts} experts do not split evenly over {self.ep} ranks")
        self.local = self.n_experts // self.ep
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[self.rank * self.local + j]) for j in range(self.local))
        self.top_k, self.capacity_factor = moe.top_k, moe.capacity_factor
        self.aux = torch.zeros(())
        self.stats: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                              # (tokens, dim)
        cap = expert_capacity(x.shape[0], self.n_experts, self.top_k, self.capacity_factor)
        experts, gates, keep, self.aux = route(self.router(x), self.top_k, cap)
        tok, choice = torch.nonzero(keep, as_tuple=True)
        e = experts[tok, choice]
        order = torch.argsort(e, stable=True)                                     # group the rows by expert
        tok, choice, e = tok[order], choice[order], e[order]

        # 1. how many rows go to each expert, and so to each rank; every rank learns what it will receive
        send_counts = torch.bincount(e, minlength=self.n_experts)                 # (E,)
        recv_counts = torch.empty_like(send_counts)
        tdist.all_to_all_single(recv_counts, send_counts, group=self.group)      # (ep * local,): [src][local expert]
        in_splits = send_counts.view(self.ep, self.local).sum(1).tolist()
        out_splits = recv_counts.view(self.ep, self.local).sum(1).tolist()

        # 2. dispatch, 3. the local experts, 4. combine
        recv = all_to_all(x[tok], out_splits, in_splits, self.group)              # (rows received, dim)
        which = torch.arange(self.local, device=x.device).repeat(self.ep).repeat_interleave(recv_counts)
        out = torch.zeros_like(recv)
        for j, expert in enumerate(self.experts):
            rows = torch.nonzero(which == j, as_tuple=True)[0]
            if len(rows):
                out = out.index_copy(0, rows, expert(recv[rows]))
        back = all_to_all(out, in_splits, out_splits, self.group)                # rows in the order we sent them
        y = torch.zeros_like(x).index_add(0, tok, gates[tok, choice, None] * back)

        self.stats = dict(load=recv_counts.view(self.ep, self.local).sum(0).tolist(), dropped=int((~keep).sum()),
                          assignments=x.shape[0] * self.top_k, sent=in_splits, capacity=cap)
        return y.view(shape)


# --------------------------------------------------------------------------- checks and measurements
def _grad(p):
    """The gradient, zeros when none arrived (an expert that got no token)."""
    return p.grad if p.grad is not None else torch.zeros_like(p)

