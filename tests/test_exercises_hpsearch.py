"""The coding exercise of notebook 15 (one rung of successive halving): accepts the reference, names mistakes."""
from ddlcourse import hpsearch
from ddlcourse.exercises import nb15_hyperparameter_search as ex
from ddlcourse.selfcheck import run_checker


def test_accepts_the_reference_and_a_solution_returning_ids():
    assert run_checker("sh_promote", hpsearch.promote).ok
    ids = lambda res, eta: [r["trial"] for r in sorted(res, key=lambda r: r["val_loss"])[:len(res) // eta]]  # noqa: E731
    assert run_checker("sh_promote", ids).ok


def test_names_typical_mistakes():
    for wrong, hint in [(ex._worst, "lower val_loss is better"), (ex._ceil, "round down"),
                        (ex._eta_many, "you kept eta"), (ex._dropped_fraction, "you dropped 1/eta"),
                        (ex._first_finished, "first results to arrive")]:
        v = run_checker("sh_promote", wrong)
        assert not v.ok and hint in v.message, (wrong.__name__, v.message)


def test_the_cases_tell_the_mistakes_apart():
    for n, eta in ex._RUNG_CASES:
        k = n // eta
        assert len({k, -(-n // eta), eta, n - k}) == 4, (n, eta)


def test_promote_is_what_successive_halving_keeps():
    res = ex._fake_results(27, seed=1)
    kept = hpsearch.promote(res, 3)
    assert len(kept) == 9 and max(r["val_loss"] for r in kept) < min(r["val_loss"] for r in res if r not in kept)
