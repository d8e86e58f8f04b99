"""The coding exercise of notebook 11 (pipeline): the 1F1B order of one stage."""
from ddlcourse.exercises import nb11_pipeline as ex
from ddlcourse.parallel.pipeline import schedule_order
from ddlcourse.selfcheck import run_checker


def test_one_f_one_b_accepts_reference():
    v = run_checker("one_f_one_b", lambda s, p, m: schedule_order("1f1b", s, p, m))
    assert v.ok, v.message


def test_one_f_one_b_accepts_a_hand_written_solution():
    def mine(stage, p, m):
        w = min(p - stage - 1, m)
        ops, f, b = [], 0, 0
        while f < w:
            ops.append(("F", f)); f += 1
        while b < m:
            if f < m:
                ops.append(("F", f)); f += 1
            ops.append(("B", b)); b += 1
        return ops
    v = run_checker("one_f_one_b", mine)
    assert v.ok, v.message


def test_one_f_one_b_names_mistakes():
    for kind, hint in [("gpipe", "GPipe"), ("one_too_many", "too many warm-up forwards"), ("reversed", "reversed")]:
        v = run_checker("one_f_one_b", ex._order_variant(kind))
        assert not v.ok and hint in v.message, (kind, v.message)
    v = run_checker("one_f_one_b", lambda s, p, m: [("F", i) for i in range(m)])
    assert not v.ok and "exactly one F and one B" in v.message
