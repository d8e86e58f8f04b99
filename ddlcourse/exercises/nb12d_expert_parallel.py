"""Exercises of notebooks/12d_expert_parallel.ipynb."""
import torch
import torch.nn.functional as F

from ddlcourse.models.transformer import route
from ddlcourse.selfcheck import code_exercise, diagnose


def _token_major(logits, top_k, capacity):
    """Wrong priority: all choices of token 0, then of token 1, ... (second choices crowd out first choices)."""
    n, E = logits.shape
    probs = torch.softmax(logits, -1)
    gates, experts = probs.topk(top_k, -1)
    onehot = F.one_hot(experts.reshape(-1), E)
    slot = (onehot.cumsum(0) - 1)[onehot.bool()].view(n, top_k)
    return experts, gates / gates.sum(-1, keepdim=True), slot < capacity


def _no_capacity(logits, top_k, capacity):
    e, g, keep, _ = route(logits, top_k, capacity)
    return e, g, torch.ones_like(keep)


def _no_renormalise(logits, top_k, capacity):
    e, g, keep, _ = route(logits, top_k, capacity)
    g_raw = torch.softmax(logits, -1).gather(1, e)
    return e, g_raw, keep


def _summary(out):
    """Kept gate weight per (token, expert): the routing decision as one comparable array."""
    experts, gates, keep = out[0], out[1], out[2]
    n, E = experts.shape[0], 8
    w = torch.zeros(n, E, dtype=torch.float64)
    w.scatter_add_(1, experts, (gates * keep).double())
    return w.numpy()


@code_exercise("moe_route")
def check_route(fn, **_):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(24, 8, generator=g) + 2.0 * torch.randn(1, 8, generator=g)   # a skewed router
    ref = route(logits, 2, 5)
    ans = fn(logits, 2, 5)
    return diagnose(_summary(ans), _summary(ref), {
        "no capacity limit: an expert keeps at most `capacity` tokens; the rest are dropped (keep=False)":
            _summary(_no_capacity(logits, 2, 5)),
        "the gates are not renormalised: divide the top-k probabilities by their sum":
            _summary(_no_renormalise(logits, 2, 5)),
        "wrong priority: serve every token's first choice before any second choice (choice-major order)":
            _summary(_token_major(logits, 2, 5)),
    }, what="the kept gate weights per token and expert")
