"""The self-check machinery for coding exercises (each notebook's checkers have tests of their own)."""
import numpy as np
import pytest

from ddlcourse import selfcheck as sc


@sc.code_exercise("_test_mean_of_ranks")
def _checker(fn, n: int = 4):
    xs = np.arange(1.0, n + 1)
    return sc.diagnose(fn(xs), xs.mean(), {"you returned the sum; divide by the number of ranks": xs.sum()})


def test_diagnose_names_the_mistake_and_the_shape():
    assert sc.diagnose([1.0, 2.0], np.array([1.0, 2.0])).ok
    v = sc.diagnose(3.0, 1.5, {"summed, not averaged": 3.0})
    assert not v.ok and v.message == "summed, not averaged"
    v = sc.diagnose([1.0], [1.0, 2.0], {"the last, smaller batch is missing": [1.0]})
    assert not v.ok and v.message == "the last, smaller batch is missing"
    v = sc.diagnose([1.0], [1.0, 2.0], what="the gradient")
    assert not v.ok and "the gradient has shape (1,), expected (2,)" in v.message
    v = sc.diagnose(1.7, 1.5)
    assert not v.ok and "differs from the reference by up to 0.2" in v.message


def test_check_code_accepts_the_reference_and_explains_a_typical_mistake(capsys):
    assert sc.check_code("_test_mean_of_ranks", lambda xs: xs.mean())
    assert "[_test_mean_of_ranks] correct" in capsys.readouterr().out
    assert not sc.check_code("_test_mean_of_ranks", lambda xs: xs.sum())
    assert "not yet: you returned the sum; divide by the number of ranks" in capsys.readouterr().out


def test_unwritten_and_crashing_code_get_a_verdict_not_a_traceback(capsys):
    def todo(xs):
        raise NotImplementedError
    assert not sc.check_code("_test_mean_of_ranks", todo)
    assert "not written yet" in capsys.readouterr().out
    assert not sc.check_code("_test_mean_of_ranks", lambda xs: xs.nosuch)
    assert "your function raised AttributeError" in capsys.readouterr().out


def test_unknown_exercise_and_missing_cluster_are_clear_errors():
    with pytest.raises(KeyError, match="no coding exercise 'nope'"):
        sc.check_code("nope", len)
    sc.code_exercise("_test_needs_ranks", distributed=True)(lambda fn: sc.Verdict(True))
    with pytest.raises(ValueError, match="pass cluster=c"):
        sc.check_code("_test_needs_ranks", len)
