"""Exercises of notebooks/21_context_parallel.ipynb."""
import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.parallel.context import online_softmax_update as _package_update
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- the online softmax update
def online_softmax_update(m, l, o, scores, v):
    """m, l: (Tq, 1); o: (Tq, d); scores: (Tq, Tk) with -inf where masked; v: (Tk, d). Return (m, l, o)."""
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    alpha = torch.exp(m - m_new)                       # what was summed with the old max, brought to the new one
    p = torch.exp(scores - m_new)
    return m_new, l * alpha + p.sum(-1, keepdim=True), o * alpha + p @ v


def _fold(update, scores, v, block):
    """Run ``update`` over the key blocks of ``scores`` (Tq, Tk) and ``v`` (Tk, d); the result ``o / l``."""
    Tq, d = scores.shape[0], v.shape[1]
    m = torch.full((Tq, 1), float("-inf"), dtype=scores.dtype)
    l, o = torch.zeros(Tq, 1, dtype=scores.dtype), torch.zeros(Tq, d, dtype=scores.dtype)
    for a in range(0, scores.shape[1], block):
        m, l, o = update(m, l, o, scores[:, a:a + block], v[a:a + block])
    return o / l


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


@code_exercise("online_softmax_update", solution=online_softmax_update, mistakes=[
    (_no_rescale_o, "running output"), (_no_rescale_l, "running sum"), (_no_max, "running max")])
def check_online_softmax_update(fn, **_):
    g = torch.Generator().manual_seed(7)
    scores = 3.0 * torch.randn(6, 16, generator=g, dtype=torch.float64)
    scores[:, 12:] += 6.0                                      # the last block has the largest scores: m must grow
    v = torch.randn(16, 5, generator=g, dtype=torch.float64)
    ref = _fold(_package_update, scores, v, 4)
    ans = _fold(fn, scores, v, 4)
    v_ = diagnose(ans, ref, {
        "o is not rescaled: multiply the running output by exp(m_old - m_new) before adding the block": _fold(
            _no_rescale_o, scores, v, 4),
        "l is not rescaled: multiply the running sum by exp(m_old - m_new) before adding the block": _fold(
            _no_rescale_l, scores, v, 4),
    }, what="o / l after folding 4 blocks")
    if not v_.ok:
        return v_
    big = scores + 800.0                                        # exp(800) overflows: the running max is needed
    ans_big = _fold(fn, big, v, 4)
    if not torch.isfinite(ans_big).all():
        return Verdict(False, "the result is not finite for large scores: subtract the running max before exp")
    return diagnose(ans_big, _fold(_package_update, big, v, 4), {}, what="o / l for large scores")


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


_NO_RESCALE = _ring_variant("no_rescale", rescale=False)
_MASK_ALL = _ring_variant("mask_every_block", mask_all=True)
_NO_SKIP = _ring_variant("future_not_skipped", skip_future=False)
_NOT_PASSED = _ring_variant("kv_not_passed_on", pass_kv=False)
_NO_DIVIDE = _ring_variant("no_division", divide=False)

HINTS = {
    "rescale": "no rescaling when the max changes: multiply the running sum l and output o by exp(m_old - m_new) "
               "before adding a block",
    "mask_all": "causal mask on every block: only the diagonal block (this rank's own K/V) needs the mask; an "
                "earlier rank's keys are all in the past of every query here",
    "future": "future blocks are not skipped: a block from a later rank (src > r) is entirely after this rank's "
              "queries; skip it",
    "not_passed": "K and V are not passed on: after each step use the block you received, not your own again",
    "own_only": "K and V are not passed on: your result is attention over this rank's own block only",
    "divide": "the division by the running sum is forgotten: return o / l",
    "batch": "the result is right, but K and V did not travel with dist.batch_isend_irecv: a separate isend then "
             "irecv deadlocks under NCCL (both ranks of a pair send first); put both into one batch of P2POps",
}


def _causal(q, k, v):
    """Full causal attention, (H, S, d) -> (H, S, d): the serial reference."""
    S = q.shape[-2]
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


@code_exercise("ring_attention_forward", distributed=True, solution=ring_attention_forward, mistakes=[
    (_NO_RESCALE, "no rescaling when the max changes"), (_MASK_ALL, "causal mask on every block"),
    (_NO_SKIP, "future blocks are not skipped"), (_NOT_PASSED, "K and V are not passed on"),
    (_NO_DIVIDE, "division by the running sum is forgotten")])
def check_ring_attention_forward(fn, **_):
    """On every rank: ``fn(q, k, v)`` on this rank's contiguous block of a causal sequence must equal full causal
    attention over the whole sequence (computed serially here), rows of this rank."""
    info = dist.init(horovod=False)
    r, n, dev = tdist.get_rank(), tdist.get_world_size(), info.device
    H, T, d = 2, 4, 8
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(H, n * T, d, generator=g, dtype=torch.float64) for _ in range(3))
    k[:, :T] += 1.5 * q[:, -1:].sign()          # early keys score high for late queries: the running max changes
    q, k, v = q.to(dev), k.to(dev), v.to(dev)
    mine = slice(r * T, (r + 1) * T)
    ref = _causal(q, k, v)[:, mine]

    calls = {"batch": 0}
    real_batch = tdist.batch_isend_irecv

    def counted(ops):
        calls["batch"] += 1
        return real_batch(ops)

    tdist.batch_isend_irecv = counted
    try:
        ans = _with_imports(fn)(q[:, mine].clone(), k[:, mine].clone(), v[:, mine].clone())
    finally:
        tdist.batch_isend_irecv = real_batch
    args = (q[:, mine], k[:, mine], v[:, mine])
    mistakes = {HINTS["rescale"]: _NO_RESCALE(*args), HINTS["mask_all"]: _MASK_ALL(*args),
                HINTS["future"]: _NO_SKIP(*args), HINTS["not_passed"]: _NOT_PASSED(*args),
                HINTS["own_only"]: _causal(*args), HINTS["divide"]: _NO_DIVIDE(*args)}
    if n == 1:
        mistakes = {HINTS["rescale"]: mistakes[HINTS["rescale"]], HINTS["divide"]: mistakes[HINTS["divide"]]}
    if not isinstance(ans, torch.Tensor) or ans.shape != ref.shape:
        v_ = Verdict(False, f"return a tensor of shape {tuple(ref.shape)}, not "
                     + (str(tuple(ans.shape)) if isinstance(ans, torch.Tensor) else type(ans).__name__))
    else:
        ans = ans.detach().to("cpu", torch.float64)
        ref = ref.cpu()
        v_ = diagnose(ans.numpy(), ref.numpy(), {h: w.cpu().numpy() for h, w in mistakes.items()},
                      rtol=1e-6, atol=1e-9, what=f"rank {r}'s attention output")
        if not v_.ok and v_.message.startswith("rank") and _rows_scaled(ans, ref):
            v_ = Verdict(False, HINTS["divide"])
        if v_.ok and n > 1 and calls["batch"] == 0:
            v_ = Verdict(False, HINTS["batch"])
    return agreed(v_)


def _rows_scaled(ans, ref):
    """Each row of ``ans`` a positive multiple of the same row of ``ref`` (o returned without dividing by l)."""
    c = (ans * ref).sum(-1, keepdim=True) / (ref * ref).sum(-1, keepdim=True)
    return bool(torch.allclose(ans, c * ref, rtol=1e-6, atol=1e-9)) and bool((c > 0).all())



def _with_imports(fn):
    """On an engine, a function from the notebook looks its globals up in the engine's namespace, where the
    notebook's imports are missing: give it the modules the template imports (names already there are kept)."""
    g = getattr(fn, "__globals__", None)
    if isinstance(g, dict):
        for name, mod in (("torch", torch), ("tdist", tdist)):
            g.setdefault(name, mod)
    return fn
