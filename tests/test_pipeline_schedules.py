"""Notebook 17: torch.distributed.pipelining schedules against the serial model; the interleaved order and
its exercise checker; the bubble formulas; the saved-activation count of GPipe and 1F1B."""
import json

import pytest

from ddlcourse import selfcheck
from ddlcourse.exercises.checkers import pipeline_schedules as ck
from ddlcourse.exercises.solutions import pipeline_schedules as sol
from ddlcourse.parallel import pipeline_schedules as S
from ddlcourse.experiments import pipeline_schedules as S_exp

from helpers import run_ranks


NAMES = ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"]


@pytest.mark.parametrize("n", [2, 4])
def test_schedules_match_serial(n):
    out = run_ranks(n, "pipeline_schedules_vs_serial", json.dumps(NAMES)).stdout
    worst, losses, held = eval(out.split("RESULT", 1)[1].strip())
    assert set(worst) == set(NAMES), out
    for name in NAMES:
        assert worst[name] < 1e-6, (name, worst[name])
        assert losses[name] == [0] * (n - 1) + [2 * n], (name, losses[name])   # one rank saw all m losses
    # stage s keeps all m = 4 micro-batches under GPipe, min(p - s, m) under 1F1B (bytes / one micro-batch)
    for s, (gpipe, f1b, busy, n_events, inter) in enumerate(held):
        assert gpipe == pytest.approx(4.0, abs=0.05) and f1b == pytest.approx(min(n - s, 4), abs=0.05), held
        assert busy and n_events == 2 * 4, held               # 4 forwards and 4 backwards timed on each rank
        want = S.predicted_held("Interleaved1F1B", s, n, 2 * n)
        assert want is None or inter == pytest.approx(want, abs=0.05), (s, inter, want)
    assert held[0][4] < 2 * n                                 # interleaving keeps fewer than GPipe's m


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 4, 2), (4, 12, 3), (3, 6, 2)])
def test_interleaved_order_equals_torch_plan(p, m, v):
    for r in range(p):
        assert S.interleaved_order(r, p, m, v) == S.torch_order("Interleaved1F1B", r, p, m, stages_per_rank=v)


def test_interleaved_order_contents_and_errors():
    order = S.interleaved_order(1, 4, 8, 2)
    assert sorted(order) == sorted((k, s, mb) for k in "FB" for s in (1, 5) for mb in range(8))
    with pytest.raises(ValueError, match="multiple of p"):
        S.interleaved_order(0, 4, 6, 2)
    with pytest.raises(ValueError, match="rank"):
        S.interleaved_order(4, 4, 8, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        S.stage_indices("PipeDream", 0, 2)


def test_stage_placement():
    assert S.stage_indices("1F1B", 2, 4) == [2]
    assert S.stage_indices("Interleaved1F1B", 1, 4) == [1, 5]
    assert S.stage_indices("ZBVZeroBubble", 0, 4) == [0, 7]       # the V: rank 0 holds the first and last


def test_predicted_bubble():
    assert S.predicted_bubble("GPipe", 4, 12) == pytest.approx(3 / 15)
    assert S.predicted_bubble("1F1B", 4, 12) == S.predicted_bubble("GPipe", 4, 12)
    assert S.predicted_bubble("Interleaved1F1B", 4, 12) == pytest.approx(3 / 27)
    assert S.predicted_bubble("InterleavedZeroBubble", 4, 12) == pytest.approx(3 / 75)   # ZB-H1: not 0
    assert S.predicted_bubble("ZBVZeroBubble", 4, 12) > 0                                 # start-up offset
    assert S_exp.bubble([dict(busy=1.0, makespan=2.0), dict(busy=2.0, makespan=2.0)]) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        S.predicted_bubble("GPipe", 0, 4)
    assert [S.predicted_held("1F1B", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [S.predicted_held("Interleaved1F1B", s, 4, 8) for s in range(4)] == [5.5, 4.5, 3.5, None]
    assert S.predicted_held("Interleaved1F1B", 0, 4, 2) == 2          # capped: all v * m forwards
    assert S.predicted_held("ZBVZeroBubble", 0, 4, 8) is None


def test_checker_accepts_reference_and_names_mistakes():
    assert selfcheck.run_checker("interleaved_order", S.interleaved_order).ok
    for kind, hint in ck.ORDER_HINTS.items():
        v = selfcheck.run_checker("interleaved_order", sol.mistake(kind))
        assert not v.ok and hint in v.message, (kind, v.message)

    def unwritten(*a):
        raise NotImplementedError
    assert "not written yet" in selfcheck.run_checker("interleaved_order", unwritten).message
    v = selfcheck.run_checker("interleaved_order", lambda r, p, m, v: S.interleaved_order(r, p, m, v)[:-1])
    assert not v.ok and "one F and one B" in v.message
