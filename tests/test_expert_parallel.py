"""Expert parallelism (all_to_all dispatch and combine) against the serial MoE with the same routing, on 2 and 4 ranks."""
import json

import pytest

from ddlcourse.experiments import expert as expert_exp

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 4])
def test_expert_parallel_equals_serial(n):
    res = json.loads(run_ranks(n, "expert_parallel_vs_serial").stdout.split("RESULT")[1])
    for per_rank in res:
        for d in per_rank:
            assert max(d["out"], d["aux"], d["router_grad"], d["expert_grad"]) < 1e-5, d
    tight = sum(r[0]["dropped"] for r in res)
    roomy = sum(r[2]["dropped"] for r in res)
    assert tight > 0 and roomy == 0                                  # capacity 0.75 drops, 4.0 keeps all
    assert sum(sum(r[1]["load"]) for r in res) == sum(r[1]["assignments"] - r[1]["dropped"] for r in res)


def test_capacity_sweep_drops_less_with_more_capacity():
    sweep = expert_exp.capacity_sweep([0.5, 1.0, 2.0, 8.0], n_tokens=128)
    drops = [s["dropped_share"] for s in sweep]
    assert drops == sorted(drops, reverse=True) and drops[0] > 0.3 and drops[-1] == 0
    assert all(max(s["load"]) <= s["capacity"] for s in sweep)
