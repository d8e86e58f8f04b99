"""Exercises of notebooks/15_hyperparameter_search.ipynb."""
import numpy as np

from ddlcourse import hpsearch
from ddlcourse.selfcheck import Verdict, code_exercise, exercise


@exercise("sh_budget", "sum over rungs of (configurations alive) x (budget of the rung); keep n // eta each time")
def sh_budget(n_configs: int, min_budget: int, eta: int) -> int:
    return hpsearch.sh_total_budget(n_configs, min_budget, eta)


@exercise("lr_scaling_exponent", "for each batch size take the lr of the lowest val_loss, then fit a line to "
          "log(lr) against log(batch_size) (np.polyfit(..., 1)[0])")
def lr_scaling_exponent(results: list) -> float:
    return hpsearch.scaling_exponent(results)


# --------------------------------------------------------------------------- coding exercise: one rung
def _fake_results(n: int, seed: int) -> list[dict]:
    """``n`` results of distinct trials with distinct validation losses, in the order they finished."""
    rng = np.random.default_rng(seed)
    losses = rng.permutation(np.linspace(0.2, 2.0, n))          # distinct: no tie-breaking questions
    trials = rng.permutation(n) + 100 * seed                    # ids unrelated to the order or the loss
    return [{"trial": int(t), "val_loss": float(v), "val_acc": float(1 / (1 + v)), "budget": 256}
            for t, v in zip(trials, losses)]


# (n results, eta): n // eta differs from ceil(n / eta), from eta and from n - n // eta
_RUNG_CASES = [(10, 4), (26, 3), (17, 3), (38, 5)]


def _ids(kept) -> list[int]:
    return sorted(int(r["trial"]) if isinstance(r, dict) else int(r) for r in kept)


def _worst(results, eta):             # sorted the wrong way
    return sorted(results, key=lambda r: -r["val_loss"])[:len(results) // eta]


def _ceil(results, eta):              # kept ceil(n / eta)
    return hpsearch.top_k(results, -(-len(results) // eta))


def _eta_many(results, eta):          # kept eta configurations
    return hpsearch.top_k(results, eta)


def _dropped_fraction(results, eta):  # dropped 1/eta instead of keeping 1/eta
    return hpsearch.top_k(results, len(results) - len(results) // eta)


def _first_finished(results, eta):    # kept the first to finish, not the best
    return results[:len(results) // eta]


@code_exercise("sh_promote")
def check_sh_promote(fn) -> Verdict:
    """``fn(results, eta)`` -> the results (or trial ids) that go on to the next rung."""
    for n, eta in _RUNG_CASES:
        res = _fake_results(n, seed=n + eta)
        got = _ids(fn([dict(r) for r in res], eta))
        ref = _ids(hpsearch.promote(res, eta))
        if got == ref:
            continue
        k = n // eta
        if len(got) != len(ref):
            hints = {-(-n // eta): f"you kept ceil(n / eta) = {-(-n // eta)}; keep n // eta = {k} (round down)",
                     eta: f"you kept eta = {eta} configurations; keep n // eta = {k} of the {n}",
                     n - k: f"you dropped 1/eta of them; successive halving keeps only the best 1/eta ({k} of {n})"}
            return Verdict(False, hints.get(len(got), f"with {n} results and eta={eta} keep {k}, you kept {len(got)}"))
        for wrong, hint in [(_worst, "you kept the highest validation losses: lower val_loss is better"),
                            (_first_finished, "you kept the first results to arrive; sort by val_loss first")]:
            if got == _ids(wrong(res, eta)):
                return Verdict(False, hint)
        return Verdict(False, f"with {n} results and eta={eta} you kept trials {got}; the best {k} are {ref}")
    return Verdict(True)
