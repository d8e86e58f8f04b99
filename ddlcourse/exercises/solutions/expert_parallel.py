"""Reference solutions of notebooks/22_expert_parallel.ipynb: the router and the dispatch and combine of an
expert-parallel layer, and each with one typical mistake (what its checker,
:mod:`ddlcourse.exercises.checkers.expert_parallel`, must name)."""
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from ddlcourse.models.transformer import route as _route
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the router
def route(logits, top_k, capacity):
    """logits: (tokens, experts). Return experts (tokens, k), gates (tokens, k), keep (tokens, k) bool."""
    n, E = logits.shape
    probs = torch.softmax(logits, -1)
    gates, experts = probs.topk(top_k, -1)
    gates = gates / gates.sum(-1, keepdim=True)                 # renormalised over the k choices
    onehot = F.one_hot(experts.t().reshape(-1), E)              # choice-major: every first choice, then the second
    slot = (onehot.cumsum(0) - 1)[onehot.bool()]                # the place of each choice in its expert's queue
    slot = slot.view(top_k, n).t()
    return experts, gates, slot < capacity


def _token_major(logits, top_k, capacity):
    """Wrong priority: all choices of token 0, then of token 1, ... (second choices crowd out first choices)."""
    n, E = logits.shape
    probs = torch.softmax(logits, -1)
    gates, experts = probs.topk(top_k, -1)
    onehot = F.one_hot(experts.reshape(-1), E)
    slot = (onehot.cumsum(0) - 1)[onehot.bool()].view(n, top_k)
    return experts, gates / gates.sum(-1, keepdim=True), slot < capacity


def _no_capacity(logits, top_k, capacity):
    e, g, keep, _ = _route(logits, top_k, capacity)
    return e, g, torch.ones_like(keep)


def _no_renormalise(logits, top_k, capacity):
    e, g, keep, _ = _route(logits, top_k, capacity)
    g_raw = torch.softmax(logits, -1).gather(1, e)
    return e, g_raw, keep


# The checker routes with each of these to name the learner's mistake (keyed as its ROUTE_HINTS).
ROUTE_VARIANTS = {"no_capacity": _no_capacity, "no_renormalise": _no_renormalise, "token_major": _token_major}

reference("moe_route", mistakes=[
    (_no_capacity, "capacity"), (_no_renormalise, "renormalised"), (_token_major, "priority")])(route)


# --------------------------------------------------------------------------- build it: dispatch and combine
def moe_dispatch_combine(x, expert_of, experts_per_rank, expert_fn):
    """Send each token to the rank that holds its expert, run the experts there, bring the results back.

    x: (n, d) this rank's tokens (n may differ from rank to rank); expert_of: (n,) int64, each token's expert
    (top-1), a global id in 0 .. n_ranks * experts_per_rank - 1; rank r holds experts r * experts_per_rank ...
    (r + 1) * experts_per_rank - 1. expert_fn(j, rows) runs this rank's local expert j on rows (m, d) -> (m, d).
    Returns (n, d): row i is the output of token i's expert on x[i], in the original order.
    """
    n_ranks = tdist.get_world_size()
    order = torch.argsort(expert_of, stable=True)               # rows grouped by expert, so by destination rank
    send_counts = torch.bincount(expert_of, minlength=n_ranks * experts_per_rank)
    recv_counts = torch.empty_like(send_counts)
    tdist.all_to_all_single(recv_counts, send_counts)           # now [source rank][my local expert]
    send_splits = send_counts.view(n_ranks, experts_per_rank).sum(1).tolist()
    recv_splits = recv_counts.view(n_ranks, experts_per_rank).sum(1).tolist()
    recv = x.new_empty((sum(recv_splits), x.shape[1]))
    tdist.all_to_all_single(recv, x[order].contiguous(), recv_splits, send_splits)
    local = torch.arange(experts_per_rank, device=x.device).repeat(n_ranks).repeat_interleave(recv_counts)
    out = torch.empty_like(recv)
    for j in range(experts_per_rank):
        rows = local == j
        out[rows] = expert_fn(j, recv[rows])
    back = torch.empty_like(x)
    tdist.all_to_all_single(back, out, send_splits, recv_splits)   # the reverse exchange
    y = torch.empty_like(x)
    y[order] = back                                             # row k of back belongs to token order[k]
    return y


def _variant(name, exchange_counts=True, restore=True, by_rank=True):
    """Dispatch and combine with one typical mistake (the flags)."""
    def moe(x, expert_of, experts_per_rank, expert_fn):
        n_ranks = tdist.get_world_size()
        dest = expert_of // experts_per_rank if by_rank else expert_of
        order = torch.argsort(dest, stable=True)
        send_splits = torch.bincount(dest, minlength=n_ranks)
        if exchange_counts:
            recv_splits = torch.empty_like(send_splits)
            tdist.all_to_all_single(recv_splits, send_splits)
        else:
            recv_splits = send_splits                           # the input splits used as output splits
        send_splits, recv_splits = send_splits.tolist(), recv_splits.tolist()
        recv_e = expert_of.new_empty(sum(recv_splits))
        tdist.all_to_all_single(recv_e, expert_of[order].contiguous(), recv_splits, send_splits)
        recv = x.new_empty((sum(recv_splits), x.shape[1]))
        tdist.all_to_all_single(recv, x[order].contiguous(), recv_splits, send_splits)
        out = torch.empty_like(recv)
        for j in range(experts_per_rank):
            rows = recv_e % experts_per_rank == j
            out[rows] = expert_fn(j, recv[rows])
        back = torch.empty_like(x)
        tdist.all_to_all_single(back, out, send_splits, recv_splits)
        if not restore:
            return back
        y = torch.empty_like(x)
        y[order] = back
        return y
    moe.__name__ = name
    return moe


_NO_COUNTS = _variant("counts_not_exchanged", exchange_counts=False)
_NOT_RESTORED = _variant("order_not_restored", restore=False)
_TO_EXPERT_ID = _variant("sent_to_expert_id", by_rank=False)

reference("moe_dispatch_combine", mistakes=[
    (_NO_COUNTS, "counts are not exchanged"), (_NOT_RESTORED, "original order is not restored"),
    (_TO_EXPERT_ID, "sent to the expert id")])(moe_dispatch_combine)
