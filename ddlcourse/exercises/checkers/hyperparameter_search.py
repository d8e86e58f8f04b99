"""Checkers of notebooks/28_hyperparameter_search.ipynb: its questions, one rung of successive halving, and the
search on the ranks the learner builds."""
import numpy as np

from ddlcourse import hpsearch
from ddlcourse.exercises.solutions.hyperparameter_search import PROMOTE_VARIANTS, SH_VARIANTS
from ddlcourse.selfcheck import Verdict, code_exercise, exercise, told


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


_PROMOTE_HINTS = {"worst": "you kept the highest validation losses: lower val_loss is better",
                  "first_finished": "you kept the first results to arrive; sort by val_loss first"}


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
        for kind, hint in _PROMOTE_HINTS.items():
            if got == _ids(PROMOTE_VARIANTS[kind](res, eta)):
                return Verdict(False, hint)
        return Verdict(False, f"with {n} results and eta={eta} you kept trials {got}; the best {k} are {ref}")
    return Verdict(True)


# --------------------------------------------------------------------------- build it: successive halving on the ranks
# (trial ids, eta, min_budget): n // eta rungs that do not divide by the ranks; ties at every cut
_SH_CASES = [(list(range(100, 113)), 3, 1), (list(range(300, 320))[::-1], 2, 4)]


def _fake_loss(trial: int, budget: int) -> float:
    """A fake objective: five levels of quality (many ties), better with a larger budget."""
    return 0.3 + 0.1 * ((trial * 7) % 5) + 1.0 / budget


def _sh_serial(trials, min_budget, eta) -> list[tuple[int, list[int]]]:
    """The same search on one process, with the package's ``top_k``: what the ranks must reproduce."""
    alive, budget, rungs = sorted(trials), min_budget, []
    while True:
        rungs.append((budget, list(alive)))
        if len(alive) // eta < 1:
            return rungs
        res = [{"trial": t, "val_loss": _fake_loss(t, budget)} for t in alive]
        alive = sorted(r["trial"] for r in hpsearch.top_k(res, len(alive) // eta))
        budget *= eta


def _norm_rungs(rungs) -> list[tuple[int, list[int]]]:
    return [(int(b), sorted(int(t) for t in alive)) for b, alive in rungs]


_SH_HINTS = {
    "worst": "you promoted the worst trials: a lower val_loss is better, sort it ascending",
    "budget_same": "the budget must grow by a factor eta from rung to rung (budget *= eta)",
    "budget_add": "the budget must grow by a factor eta from rung to rung (budget *= eta), not by adding",
    "arrival_ties": "trials with equal val_loss: break ties by the smaller trial id, as hp.top_k does",
}
_SH_DISAGREE = ("the ranks disagree on which trials go on (their lists differ): every rank must break ties "
                "between equal val_loss the same way, e.g. sort by (val_loss, trial)")
_SH_ALL_TRAIN = "every trial must be trained once per rung, by one rank: rank r trains alive[r::size]"


@code_exercise("sh_on_ranks", distributed=True, ranks=(2, 3))
def check_sh_on_ranks(fn, **_) -> Verdict:
    """On every rank: ``fn(trials, objective, min_budget, eta, comm)`` -> one ``(budget, trial ids)`` per rung,
    the same on every rank. Compared with a serial run of successive halving on a fake objective with ties."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    comm = MPI.COMM_WORLD
    for trials, eta, b0 in _SH_CASES:
        calls = []

        def objective(trial, budget):
            calls.append((int(trial), int(budget)))
            return _fake_loss(int(trial), int(budget))

        error, got = None, None
        try:
            got = _norm_rungs(fn(list(trials), objective, b0, eta, comm))
        except Exception as e:          # raised after the others agree, so that no rank waits for ever
            error = e
        elsewhere = told(error)
        if elsewhere is not None:
            return elsewhere
        every, all_calls = comm.allgather(got), comm.allgather(calls)
        ref = _norm_rungs(_sh_serial(trials, b0, eta))
        where = f"{len(trials)} trials, eta={eta}, min_budget={b0}"
        if any(g != every[0] for g in every):
            return Verdict(False, f"{where}: {_SH_DISAGREE}")
        trained = sorted(c for cs in all_calls for c in cs)
        if got != ref:
            args = (list(trials), _fake_loss, b0, eta, comm)
            wrong = {h: _norm_rungs(SH_VARIANTS[k](*args)) for k, h in _SH_HINTS.items()}
            for hint, w in wrong.items():
                if got == w:
                    return Verdict(False, f"{where}: {hint}")
            if len(got) != len(ref):
                return Verdict(False, f"{where}: {len(got)} rungs, expected {len(ref)} (keep n // eta each time; "
                                      "stop after the rung where fewer than eta are left)")
            i = next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)
            return Verdict(False, f"{where}: rung {i} is (budget, trials) = {got[i]}, expected {ref[i]}")
        expected = sorted((t, b) for b, alive in ref for t in alive)
        if trained != expected:
            if sorted(set(trained)) == expected:
                return Verdict(False, f"{where}: {_SH_ALL_TRAIN}")
            if [t for t, _ in trained] == [t for t, _ in expected]:
                return Verdict(False, f"{where}: {_SH_HINTS['budget_same']}; the objective was called with "
                                      f"budgets {sorted({b for _, b in trained})}")
            return Verdict(False, f"{where}: the objective was called {len(trained)} times with "
                                  f"(trial, budget) pairs that are not the rungs you returned")
    return Verdict(True)
