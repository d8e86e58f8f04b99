"""Reference solutions of notebooks/21_context_parallel.ipynb: the online softmax update and ring attention's
forward, and each with one typical mistake (what its checker, :mod:`ddlcourse.exercises.checkers.context_parallel`,
must name)."""
import torch
import torch.distributed as tdist

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the online softmax update
def online_softmax_update(m, l, o, scores, v):
    """m, l: (Tq, 1); o: (Tq, d); scores: (Tq, Tk) with -inf where masked; v: (Tk, d). Return (m, l, o)."""
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    alpha = torch.exp(m - m_new)                       # what was summed with the old max, brought to the new one
    p = torch.exp(scores - m_new)
    return m_new, l * alpha + p.sum(-1, keepdim=True), o * alpha + p @ v


def _no_rescale_o(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, l * torch.exp(m - m_new) + p.sum(-1, keepdim=True), o + p @ v


def _no_rescale_l(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, l + p.sum(-1, keepdim=True), o * torch.exp(m - m_new) + p @ v


def _no_max(m, l, o, scores, v):
    p = torch.exp(scores)
    return m, l + p.sum(-1, keepdim=True), o + p @ v


# The checker folds the first two to name the learner's mistake (keyed as its SOFTMAX_HINTS); a missing max shows
# as a result that is not finite for large scores.
SOFTMAX_VARIANTS = {"no_rescale_o": _no_rescale_o, "no_rescale_l": _no_rescale_l, "no_max": _no_max}

reference("online_softmax_update", mistakes=[
    (_no_rescale_o, "running output"), (_no_rescale_l, "running sum"), (_no_max, "running max")])(online_softmax_update)


# --------------------------------------------------------------------------- build it: ring attention's forward
def ring_attention_forward(q, k, v):
    """Causal attention of this rank's queries over the whole sequence, K and V passed around the ring.

    Contiguous split: rank r holds tokens r*T ... (r+1)*T - 1 of a sequence of n_ranks*T tokens.
    q, k, v: (H, T, d), this rank's block (H heads, T tokens, head size d). Returns (H, T, d).
    """
    r, n = tdist.get_rank(), tdist.get_world_size()
    T, scale = q.shape[-2], q.shape[-1] ** -0.5
    m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
    l, o = torch.zeros_like(m), torch.zeros_like(q)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    k_blk, v_blk = k.contiguous(), v.contiguous()
    for step in range(n):
        src = (r - step) % n                           # the rank whose block this is
        if src <= r:                                   # a block from a later rank is all in the future: skip it
            s = q @ k_blk.transpose(-2, -1) * scale
            if src == r:                               # the diagonal block: mask the keys after each query
                s = s.masked_fill(future, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
            l = l * alpha + p.sum(-1, keepdim=True)
            o = o * alpha + p @ v_blk
            m = m_new
        if step < n - 1:                               # pass the block on, get the previous rank's
            k_in, v_in = torch.empty_like(k_blk), torch.empty_like(v_blk)
            ops = [tdist.P2POp(tdist.isend, k_blk, (r + 1) % n), tdist.P2POp(tdist.isend, v_blk, (r + 1) % n),
                   tdist.P2POp(tdist.irecv, k_in, (r - 1) % n), tdist.P2POp(tdist.irecv, v_in, (r - 1) % n)]
            for req in tdist.batch_isend_irecv(ops):
                req.wait()
            k_blk, v_blk = k_in, v_in
    return o / l


def _ring_variant(name, rescale=True, mask_all=False, skip_future=True, pass_kv=True, divide=True):
    """Ring attention with one typical mistake (the flags), the same communication as the right one."""
    def ring(q, k, v):
        r, n = tdist.get_rank(), tdist.get_world_size()
        T, scale = q.shape[-2], q.shape[-1] ** -0.5
        m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
        l, o = torch.zeros_like(m), torch.zeros_like(q)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        k_blk, v_blk = k.contiguous(), v.contiguous()
        for step in range(n):
            src = (r - step) % n
            if src <= r or not skip_future:
                s = q @ k_blk.transpose(-2, -1) * scale
                if src == r or mask_all:
                    s = s.masked_fill(future, float("-inf"))
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                alpha = torch.exp(m - m_new) if rescale else torch.ones_like(m)
                p = torch.exp(s - m_new)
                l, o, m = l * alpha + p.sum(-1, keepdim=True), o * alpha + p @ v_blk, m_new
            if step < n - 1:
                k_in, v_in = torch.empty_like(k_blk), torch.empty_like(v_blk)
                ops = [tdist.P2POp(tdist.isend, k_blk, (r + 1) % n), tdist.P2POp(tdist.isend, v_blk, (r + 1) % n),
                       tdist.P2POp(tdist.irecv, k_in, (r - 1) % n), tdist.P2POp(tdist.irecv, v_in, (r - 1) % n)]
                for req in tdist.batch_isend_irecv(ops):
                    req.wait()
                if pass_kv:
                    k_blk, v_blk = k_in, v_in
        return o / l if divide else o
    ring.__name__ = name
    return ring


# The checker runs each of these on the ranks to name the learner's mistake (keyed as its HINTS).
RING_VARIANTS = {
    "rescale": _ring_variant("no_rescale", rescale=False),
    "mask_all": _ring_variant("mask_every_block", mask_all=True),
    "future": _ring_variant("future_not_skipped", skip_future=False),
    "not_passed": _ring_variant("kv_not_passed_on", pass_kv=False),
    "divide": _ring_variant("no_division", divide=False),
}

def _own_block_only(q, k, v):
    """No ring at all: causal attention over this rank's own block (right on rank 0 only)."""
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).masked_fill(
        torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


reference("ring_attention_forward", mistakes=[
    (_own_block_only, "your result is attention over this rank's own block only"),
    (RING_VARIANTS["rescale"], "no rescaling when the max changes"),
    (RING_VARIANTS["mask_all"], "causal mask on every block"),
    (RING_VARIANTS["future"], "future blocks are not skipped"),
    (RING_VARIANTS["not_passed"], "K and V are not passed on"),
    (RING_VARIANTS["divide"], "division by the running sum is forgotten")])(ring_attention_forward)
