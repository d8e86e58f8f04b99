"""The small transformer, its MoE routing and the sort task."""
import math

import pytest
import torch

from ddlcourse.data import tokens
from ddlcourse.models import transformer as T


def small(**kw):
    return T.TransformerConfig(**{**dict(vocab=11, seq_len=16, dim=32, n_heads=4, n_layers=2), **kw})


def test_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible"):
        T.TransformerConfig(dim=30, n_heads=4)
    with pytest.raises(ValueError, match="top_k"):
        T.TransformerConfig(n_experts=2, top_k=3)


@pytest.mark.parametrize("experts", [0, 4])
def test_causal_future_tokens_do_not_change_the_past(experts):
    model = T.build(small(n_experts=experts, capacity_factor=8.0))
    x, _ = tokens.sort_batch(2, 10, 8, seed=0)
    a = model(x)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 3) % 10
    b = model(x2)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-3)


def test_attention_matches_torch_sdpa():
    q, k, v = (torch.randn(2, 3, 10, 8, dtype=torch.float64) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(T.causal_attention(q, k, v), ref, atol=1e-10)


def test_route_respects_capacity_and_priority():
    torch.manual_seed(0)
    logits = torch.randn(40, 4) + torch.tensor([3.0, 0, 0, 0])     # expert 0 is everyone's favourite
    cap = T.expert_capacity(40, 4, 2, 1.0)
    assert cap == 20
    experts, gates, keep, aux = T.route(logits, 2, cap)
    load = torch.bincount(experts[keep], minlength=4)
    assert int(load.max()) <= cap and int(load[0]) == cap
    assert torch.allclose(gates.sum(-1), torch.ones(40))
    first_dropped = torch.nonzero(~keep[:, 0])[0, 0]                 # first choices are served in token order
    assert keep[:first_dropped, 0].all()
    assert float(aux) > 1.0                                          # imbalanced: above the uniform value 1
    _, _, _, aux_u = T.route(torch.zeros(40, 4) + 1e-3 * torch.randn(40, 4), 1, 40)
    assert abs(float(aux_u) - 1.0) < 0.2


def test_moe_with_room_for_all_equals_weighted_experts():
    torch.manual_seed(1)
    moe = T.MoE(8, 16, n_experts=4, top_k=2, capacity_factor=4.0)
    x = torch.randn(12, 8)
    y = moe(x)
    probs = torch.softmax(moe.router(x), -1)
    g, e = probs.topk(2, -1)
    g = g / g.sum(-1, keepdim=True)
    ref = torch.stack([sum(g[i, j] * moe.experts[int(e[i, j])](x[i]) for j in range(2)) for i in range(12)])
    assert torch.allclose(y, ref, atol=1e-6) and moe.stats["dropped"] == 0


def test_sort_task_is_deterministic_sharded_and_sorted():
    x, y = tokens.sort_batch(8, 10, 6, seed=3)
    x2, y2 = tokens.sort_batch(4, 10, 6, seed=3, start=4)
    assert torch.equal(x[4:], x2) and torch.equal(y[4:], y2)
    assert (x[:, 6] == 10).all()                                    # the separator
    ans = y[:, 6:]
    assert (ans[:, 1:] >= ans[:, :-1]).all() and (y[:, :6] == -100).all()
    assert torch.equal(ans.sort(-1).values, x[:, :6].sort(-1).values)
    with pytest.raises(ValueError):
        tokens.sort_batch(0)


def test_training_learns_to_sort():
    r = T.train_sort(small(n_layers=1), steps=60, batch=32, lr=3e-3)
    assert r["losses"][-1] < 0.6 * r["losses"][0]
    assert r["test_loss"] < 0.6 * math.log(10)
