"""Exercises of notebooks/12c_context_parallel.ipynb."""
import torch

from ddlcourse.parallel.context import online_softmax_update
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose


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


@code_exercise("online_softmax_update")
def check_online_softmax_update(fn, **_):
    g = torch.Generator().manual_seed(7)
    scores = 3.0 * torch.randn(6, 16, generator=g, dtype=torch.float64)
    scores[:, 12:] += 6.0                                      # the last block has the largest scores: m must grow
    v = torch.randn(16, 5, generator=g, dtype=torch.float64)
    ref = _fold(online_softmax_update, scores, v, 4)
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
    return diagnose(ans_big, _fold(online_softmax_update, big, v, 4), {}, what="o / l for large scores")
