"""Context parallelism: causal ring attention, written by hand (notebook 21 · context parallelism).

The sequence is split over the ``cp`` ranks of a group. Everything in a transformer except attention
works token by token, so it runs on a rank's own tokens unchanged. Attention needs every earlier key and
value: the ranks pass their K/V blocks around a ring (``isend`` to the next rank, ``irecv`` from the
previous one), and each rank folds every block it sees into its queries' result with the *online softmax*
(blockwise softmax with a running max ``m``, a running sum ``l`` and a running output ``o``; Milakov &
Gimelshein 2018, FlashAttention, Ring Attention by Liu et al. 2023)::

    for step in range(cp):                       # the block that arrives at step s came from rank r - s
        s      = q @ k_blk.T / sqrt(d)  (causal mask by true positions)
        m_new  = max(m, rowmax(s))
        l      = l * exp(m - m_new) + rowsum(exp(s - m_new))
        o      = o * exp(m - m_new) + exp(s - m_new) @ v_blk
        m      = m_new
        k_blk, v_blk = ring_shift(k_blk, v_blk)
    out = o / l

This equals full softmax attention exactly (up to rounding), forward and backward: the shift is an autograd
function whose backward sends the gradient the other way round the ring.

**Causal imbalance.** With a contiguous split, rank 0 holds the first tokens: its queries see only its own
block, while the last rank's queries see all ``cp`` blocks. Blocks entirely in the future are skipped (a rank
works in half-blocks), so rank ``r`` computes ``(r + 3/4)`` blocks of scores: the last does ``(4cp-1)/3`` times
the work of the first. The *zig-zag* split cuts the sequence into
``2cp`` chunks and gives rank ``r`` chunks ``r`` and ``2cp-1-r``: an early and a late chunk, the same work
on every rank. Both layouts run the same code: the positions travel with the blocks.
"""
from __future__ import annotations

import math
import time
from functools import partial

import torch
import torch.distributed as tdist

from ddlcourse.device import synchronize
from ddlcourse.parallel import traffic

LAYOUTS = ("contiguous", "zigzag")


# --------------------------------------------------------------------------- who holds which tokens
def chunk_ids(rank: int, cp: int, layout: str = "zigzag") -> list[int]:
    """The sequence chunks rank ``rank`` holds: ``[rank]`` of ``cp`` chunks, or ``[rank, 2cp-1-rank]`` of ``2cp``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is outside 0..{cp - 1}")
    return [rank] if layout == "contiguous" else [rank, 2 * cp - 1 - rank]


def positions(rank: int, cp: int, seq_len: int, layout: str = "zigzag") -> torch.Tensor:
    """The positions (in the full sequence) of the tokens rank ``rank`` holds, in the order it holds them."""
    n = cp if layout == "contiguous" else 2 * cp
    if seq_len % n:
        raise ValueError(f"seq_len {seq_len} must be divisible by {n} for the {layout} layout on {cp} ranks")
    c = seq_len // n
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunk_ids(rank, cp, layout)])


def shard(x: torch.Tensor, rank: int, cp: int, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """This rank's tokens of ``x`` along ``dim`` (the sequence dimension)."""
    pos = positions(rank, cp, x.shape[dim], layout).to(x.device)
    return x.index_select(dim, pos)


# --------------------------------------------------------------------------- the ring
def _ring_peers(group):
    r, n = tdist.get_rank(group), tdist.get_world_size(group)
    glob = partial(tdist.get_global_rank, group) if group is not None else (lambda i: i)
    return glob((r + 1) % n), glob((r - 1) % n)


def _sendrecv(x: torch.Tensor, to: int, frm: int, group) -> torch.Tensor:
    """Send ``x`` to global rank ``to`` and receive a tensor of the same shape from ``frm``, at the same time."""
    x = x.contiguous()
    out = torch.empty_like(x)
    # One batched launch: around a ring, a separate isend then irecv on one NCCL communicator can deadlock
    # (every rank's send waits for a receive that is queued behind it); gloo hides it, NCCL does not.
    ops = [tdist.P2POp(tdist.isend, x, to, group=group), tdist.P2POp(tdist.irecv, out, frm, group=group)]
    for q in tdist.batch_isend_irecv(ops):
        q.wait()
    return out


class _RingShift(torch.autograd.Function):
    """Forward: pass ``x`` to the next rank, get the previous rank's. Backward: gradients go the other way."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        nxt, prv = _ring_peers(group)
        traffic.add("ring", x.numel() * x.element_size())
        return _sendrecv(x, nxt, prv, group)

    @staticmethod
    def backward(ctx, g):
        nxt, prv = _ring_peers(ctx.group)
        traffic.add("ring", g.numel() * g.element_size())
        return _sendrecv(g, prv, nxt, ctx.group), None


def ring_shift(x: torch.Tensor, group=None) -> torch.Tensor:
    return _RingShift.apply(x, group)


# --------------------------------------------------------------------------- the online softmax
def online_softmax_update(m, l, o, scores, v):
    """Fold one block of attention scores into the running state; returns ``(m, l, o)``.

    m, l: (..., Tq, 1) running row max (a constant for stability: it cancels in ``o / l``) and running sum
    of ``exp(score - m)``; o: (..., Tq, d) running ``sum exp(score - m) v``; scores: (..., Tq, Tk) with
    ``-inf`` where masked; v: (..., Tk, d). Start from ``m = -inf, l = 0, o = 0``; the result is ``o / l``.
    """
    with torch.no_grad():                          # the max is only for stability: no gradient through it
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    alpha = torch.exp(m - m_new)                  # rescales what was summed with the old max
    p = torch.exp(scores - m_new)
    return m_new, l * alpha + p.sum(-1, keepdim=True), o * alpha + p @ v


def _runs(pos: torch.Tensor) -> list[slice]:
    """The blocks a rank works in: its two halves (the zig-zag chunks), further cut where positions jump."""
    pos = pos.tolist()                             # one copy to the host, not an int() per element on a GPU
    jumps = {i + 1 for i in range(len(pos) - 1) if pos[i + 1] != pos[i] + 1}
    cuts = sorted({0, len(pos) // 2, len(pos)} | jumps - {0})
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def blockwise_attention(q, k, v, q_pos, k_pos, state=None, stats=None):
    """Fold keys/values ``k, v`` (at ``k_pos``) into the queries' online-softmax ``state`` (causal).

    Work happens per run of consecutive positions; a (query run, key run) pair that lies entirely in the
    future is skipped, and only a pair that straddles the diagonal needs the mask. ``stats['scores']``
    counts the attention scores computed (the work).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    if state is None:
        shape = q.shape[:-1] + (1,)
        state = [[torch.full(shape[:-2] + (s.stop - s.start, 1), float("-inf"), device=q.device, dtype=q.dtype),
                  torch.zeros(shape[:-2] + (s.stop - s.start, 1), device=q.device, dtype=q.dtype),
                  torch.zeros(q.shape[:-2] + (s.stop - s.start, q.shape[-1]), device=q.device, dtype=q.dtype)]
                 for s in _runs(q_pos)]
    qh, kh = q_pos.tolist(), k_pos.tolist()        # positions on the host, read once (no sync per block on a GPU)
    for st, qs in zip(state, _runs(q_pos)):
        qp = q_pos[qs]
        for ks in _runs(k_pos):
            kp = k_pos[ks]
            if kh[ks.start] > qh[qs.stop - 1]:    # every key in the future of every query: nothing to do
                continue
            s = q[..., qs, :] @ k[..., ks, :].transpose(-2, -1) * scale
            if kh[ks.stop - 1] > qh[qs.start]:    # straddles the diagonal: mask the future keys
                s = s.masked_fill(kp[None, :] > qp[:, None], float("-inf"))
            st[:] = online_softmax_update(*st, s, v[..., ks, :])
            if stats is not None:
                stats["scores"] = stats.get("scores", 0) + s.shape[-2] * s.shape[-1]
    return state


def ring_attention(q, k, v, q_pos, k_pos, group=None, stats=None):
    """Causal attention of this rank's queries over the whole sequence, K/V passed around the ring.

    q, k, v: (batch, heads, T_local, head_dim), this rank's tokens; q_pos = k_pos: their true positions.
    ``stats`` (a dict) gets ``scores`` (attention scores computed here) and ``compute_s`` (time computing).
    Usable as a model's ``attn_fn`` (``functools.partial(ring_attention, group=g)``).
    """
    cp = tdist.get_world_size(group)
    kv, kp = torch.stack([k, v]), k_pos.clone()            # (2, batch, heads, T_local, head_dim)
    state, compute = None, 0.0
    for step in range(cp):
        synchronize(q.device)                              # the clock starts when the device is idle
        t0 = time.perf_counter()
        state = blockwise_attention(q, kv[0], kv[1], q_pos, kp, state, stats)
        synchronize(q.device)
        compute += time.perf_counter() - t0
        if step < cp - 1:
            kv = ring_shift(kv, group)                    # the next block: the previous rank's (r - step - 1)
            nxt, prv = _ring_peers(group)
            kp = _sendrecv(kp, nxt, prv, group)            # positions travel with their block (not differentiated)
    if stats is not None:
        stats["compute_s"] = stats.get("compute_s", 0.0) + compute
    out = torch.cat([o / l for _, l, o in state], dim=-2)
    # A rank that skipped the last blocks (all in its future) must still run every shift's backward, or its
    # ring neighbours wait for ever for the gradient it should pass on: keep the last block in the graph.
    return out + 0.0 * kv.sum() if cp > 1 and kv.requires_grad else out


# --------------------------------------------------------------------------- work per rank, predicted
def scores_per_rank(seq_len: int, cp: int, layout: str = "zigzag") -> list[int]:
    """Attention scores each rank computes with :func:`ring_attention` (blocks skipped when in the future)."""
    out = []
    for r in range(cp):
        stats = {}
        pos = positions(r, cp, seq_len, layout)
        q = torch.zeros(1, 1, len(pos), 1)
        for src in range(cp):
            blockwise_attention(q, q, q, pos, positions(src, cp, seq_len, layout), None, stats)
        out.append(stats.get("scores", 0))
    return out


# --------------------------------------------------------------------------- checks against serial

