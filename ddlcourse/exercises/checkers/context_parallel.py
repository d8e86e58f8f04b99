"""Checkers of notebooks/21_context_parallel.ipynb: the online softmax update and ring attention's forward, against
the package's update and full causal attention (their references and typical mistakes are in
:mod:`ddlcourse.exercises.solutions.context_parallel`)."""
import torch
import torch.distributed as tdist

from ddlcourse import dist
from ddlcourse.exercises.solutions.context_parallel import RING_VARIANTS, SOFTMAX_VARIANTS
from ddlcourse.parallel.context import online_softmax_update as _package_update
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- the online softmax update
def _fold(update, scores, v, block):
    """Run ``update`` over the key blocks of ``scores`` (Tq, Tk) and ``v`` (Tk, d); the result ``o / l``."""
    Tq, d = scores.shape[0], v.shape[1]
    m = torch.full((Tq, 1), float("-inf"), dtype=scores.dtype)
    l, o = torch.zeros(Tq, 1, dtype=scores.dtype), torch.zeros(Tq, d, dtype=scores.dtype)
    for a in range(0, scores.shape[1], block):
        m, l, o = update(m, l, o, scores[:, a:a + block], v[a:a + block])
    return o / l


SOFTMAX_HINTS = {   # the checker folds the wrong update of each kind (SOFTMAX_VARIANTS) to name the mistake
    "no_rescale_o": "o is not rescaled: multiply the running output by exp(m_old - m_new) before adding the block",
    "no_rescale_l": "l is not rescaled: multiply the running sum by exp(m_old - m_new) before adding the block",
}


@code_exercise("online_softmax_update")
def check_online_softmax_update(fn, **_):
    g = torch.Generator().manual_seed(7)
    scores = 3.0 * torch.randn(6, 16, generator=g, dtype=torch.float64)
    scores[:, 12:] += 6.0                                      # the last block has the largest scores: m must grow
    v = torch.randn(16, 5, generator=g, dtype=torch.float64)
    ref = _fold(_package_update, scores, v, 4)
    ans = _fold(fn, scores, v, 4)
    wrong = {hint: _fold(SOFTMAX_VARIANTS[kind], scores, v, 4) for kind, hint in SOFTMAX_HINTS.items()}
    v_ = diagnose(ans, ref, wrong, what="o / l after folding 4 blocks")
    if not v_.ok:
        return v_
    big = scores + 800.0                                        # exp(800) overflows: the running max is needed
    ans_big = _fold(fn, big, v, 4)
    if not torch.isfinite(ans_big).all():
        return Verdict(False, "the result is not finite for large scores: subtract the running max before exp")
    return diagnose(ans_big, _fold(_package_update, big, v, 4), {}, what="o / l for large scores")


# --------------------------------------------------------------------------- build it: ring attention's forward
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


@code_exercise("ring_attention_forward", distributed=True)
def check_ring_attention_forward(fn, **_):
    """On every rank: ``fn(q, k, v)`` on this rank's contiguous block of a causal sequence must equal full causal
    attention over the whole sequence (computed serially here), rows of this rank."""
    info = dist.init()
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
    # each wrong ring's output (own_only, attention over this rank's block alone, is the serial one on it)
    mistakes = {HINTS[kind]: (_causal if kind == "own_only" else RING_VARIANTS[kind])(*args)
                for kind in ("rescale", "mask_all", "future", "not_passed", "own_only", "divide")}
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
    # first the result on every rank, then how K and V travelled: rank 0's own block is all it needs, so a
    # ring that never passes K and V is right there, and the wrong result of rank 1 says more than the
    # missing batch of rank 0
    v_ = agreed(v_)
    if v_.ok and n > 1:
        v_ = agreed(Verdict(calls["batch"] > 0, HINTS["batch"]))
    return v_


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
