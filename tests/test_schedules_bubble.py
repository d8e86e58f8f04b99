"""Bubble of the zero-bubble schedules (issue 27): each schedule has its own formula, and each formula equals
the idle time of torch's own plan run on a model of the ranks with those times (no MPI, no timing)."""
import pytest

from ddlcourse.parallel import pipeline_schedules as S

ZB_AND_DUALPIPE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


@pytest.mark.parametrize("name", ZB_AND_DUALPIPE)
def test_zero_bubble_schedules_are_not_zero(name):
    # the old formula returned 0.0 for every schedule with ZeroBubble in its name and for DualPipeV
    for p, m in [(2, 8), (4, 8), (4, 16), (8, 16)]:
        assert S.predicted_bubble(name, p, m) > 0
        assert S.simulate_bubble(name, p, m)["bubble"] > 0


def test_zb_h1_formula():
    # Qi et al. 2024, sec. 2.1: (p-1)(T_F + T_B - T_W) per rank; a third of 1F1B's (p-1)(T_F+T_B+T_W) at equal times
    p, m = 4, 8
    assert S.predicted_idle("InterleavedZeroBubble", p, m) == pytest.approx(3.0)
    assert S.predicted_idle("Interleaved1F1B", p, m) == pytest.approx(3 * S.predicted_idle("InterleavedZeroBubble", p, m))
    assert S.predicted_idle("InterleavedZeroBubble", p, m, t_f=1.5, t_b=1.0, t_w=0.7) == pytest.approx(3 * 1.8)
    assert S.predicted_bubble("InterleavedZeroBubble", p, m) == pytest.approx(3 / (3 * 2 * 8 + 3))
    with pytest.raises(ValueError):
        S.predicted_idle("InterleavedZeroBubble", p, m, t_w=2.0)


def test_dualpipe_formula():
    # DeepSeek-V3 report, Table 2: (PP/2 - 1)(T_F&B + T_B - 3 T_W), PP = 2p stages, T_B the full backward
    assert S.predicted_idle("DualPipeV", 4, 8) == pytest.approx(3 * (3 + 2 - 3))
    assert S.predicted_idle("DualPipeV", 4, 8, t_w=0.5) == pytest.approx(3 * (2.5 + 1.5 - 1.5))
    assert S.predicted_idle("ZBVZeroBubble", 4, 8) == pytest.approx(3.0)


@pytest.mark.parametrize("name", list(S.SCHEDULES))
@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8), (4, 16), (8, 16)])
def test_formula_matches_torch_plan(name, p, m):
    times = [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.0, 2.0, 0.5), (1.5, 1.0, 0.7)]
    checked = 0
    for t in times:
        try:
            pred = S.predicted_bubble(name, p, m, *t)
        except ValueError:          # outside the range of that schedule's formula
            continue
        sim = S.simulate_bubble(name, p, m, *t)
        assert sim["bubble"] == pytest.approx(pred, abs=1e-12)
        assert sim["idle"] == pytest.approx(S.predicted_idle(name, p, m, *t), abs=1e-9)
        checked += 1
    assert checked >= 1


def test_plan_counts_every_action():
    for name in S.SCHEDULES:
        orders = S.plan(name, 4, 8)
        _, v, _ = S.SCHEDULES[name]
        sim = S.simulate_bubble(name, 4, 8)
        assert all(b == pytest.approx(v * 8 * 3) for b in sim["busy"].values())   # F + B + W of v stages
        assert len(orders) == 4
