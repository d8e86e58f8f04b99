"""The coding exercises of notebook 16 (pipeline): the 1F1B order of one stage, and a 1F1B executor.

``tests/test_build_it.py`` runs each reference and its registered mistakes; here: other correct ways to write
them pass, and mistakes that are not registered are still caught."""
from ddlcourse.selfcheck import run_checker

from helpers import check_on_ranks


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


def test_one_f_one_b_names_missing_operations():
    v = run_checker("one_f_one_b", lambda s, p, m: [("F", i) for i in range(m)])
    assert not v.ok and "exactly one F and one B" in v.message


def test_pipeline_1f1b_other_solutions_on_ranks():
    check_on_ranks(3, "exercises_pipeline_1f1b")
