"""Ring attention (causal, contiguous and zig-zag) against full attention and the serial model, on 2 and 4 ranks."""
import json

import pytest
import torch

from ddlcourse.parallel import context

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 4])
def test_ring_attention_equals_full_attention(n):
    res = json.loads(run_ranks(n, "context_parallel_ring_attention").stdout.split("RESULT")[1])
    for layout in context.LAYOUTS:
        assert max(r[layout]["attn"] for r in res) < 1e-12          # float64: exact up to rounding
        assert max(r[layout]["model"] for r in res) < 1e-5          # float32 model, loss and every gradient
        assert [r[layout]["scores"] for r in res] == context.scores_per_rank(32, n, layout)


def test_positions_cover_the_sequence_once():
    for cp in (1, 2, 4):
        for layout in context.LAYOUTS:
            allpos = torch.cat([context.positions(r, cp, 32, layout) for r in range(cp)])
            assert sorted(allpos.tolist()) == list(range(32))
    assert context.positions(1, 4, 32, "zigzag").tolist() == [4, 5, 6, 7, 24, 25, 26, 27]
    with pytest.raises(ValueError, match="divisible"):
        context.positions(0, 4, 12, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        context.chunk_ids(0, 2, "spiral")


def test_zigzag_balances_the_causal_work():
    contiguous = context.scores_per_rank(256, 4, "contiguous")
    zigzag = context.scores_per_rank(256, 4, "zigzag")
    assert contiguous == [int(4096 * (r + 0.75)) for r in range(4)]  # rank r: r + 3/4 blocks of 64 x 64
    assert 3 * contiguous[-1] == (4 * 4 - 1) * contiguous[0]          # the last rank: (4cp - 1)/3 times the first
    assert zigzag == [32 * 32 * 9] * 4                               # every rank: 2cp + 1 half-chunk blocks
    assert sum(zigzag) < sum(contiguous) * 1.01 + 1


def test_online_softmax_equals_softmax_in_one_go():
    torch.manual_seed(0)
    s, v = torch.randn(3, 12, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
    m, l, o = torch.full((3, 1), float("-inf"), dtype=torch.float64), torch.zeros(3, 1, dtype=torch.float64), \
        torch.zeros(3, 5, dtype=torch.float64)
    for blk in range(3):
        m, l, o = context.online_softmax_update(m, l, o, s[:, 4 * blk:4 * blk + 4], v[4 * blk:4 * blk + 4])
    assert torch.allclose(o / l, torch.softmax(s, -1) @ v, atol=1e-12)
