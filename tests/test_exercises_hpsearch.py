"""The coding exercises of notebook 28. tests/test_build_it.py checks the references and the registered
mistakes; here: other correct solutions are accepted, and the cases tell the mistakes apart."""
from ddlcourse import hpsearch
from ddlcourse.exercises.checkers import hyperparameter_search as ex
from ddlcourse.selfcheck import run_checker

from helpers import check_on_ranks


def test_sh_promote_accepts_the_package_function_and_ids():
    assert run_checker("sh_promote", hpsearch.promote).ok
    ids = lambda res, eta: [r["trial"] for r in sorted(res, key=lambda r: r["val_loss"])[:len(res) // eta]]  # noqa: E731
    assert run_checker("sh_promote", ids).ok


def test_the_rung_cases_tell_the_mistakes_apart():
    for n, eta in ex._RUNG_CASES:
        k = n // eta
        assert len({k, -(-n // eta), eta, n - k}) == 4, (n, eta)


def test_the_fake_objective_has_ties_at_every_cut():
    for trials, eta, b0 in ex._SH_CASES:
        for budget, alive in ex._sh_serial(trials, b0, eta)[:-1]:
            losses = sorted(ex._fake_loss(t, budget) for t in alive)
            k = len(alive) // eta
            assert losses[k - 1] == losses[k], (trials[0], budget)    # a tie across the cut


def test_sh_on_ranks_accepts_another_correct_search():
    check_on_ranks(3, "exercises_hpsearch_sh_on_ranks")
