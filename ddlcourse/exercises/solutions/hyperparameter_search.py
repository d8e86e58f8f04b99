"""Reference solutions of notebooks/28_hyperparameter_search.ipynb: one rung of successive halving, and the whole
search on the ranks; each with typical mistakes (what :mod:`ddlcourse.exercises.checkers.hyperparameter_search` must
name)."""
from ddlcourse import hpsearch
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: one rung
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


# the mistakes the checker recognises by the trials kept (the others it tells by their number)
PROMOTE_VARIANTS = {"worst": _worst, "first_finished": _first_finished}


@reference("sh_promote", mistakes=[
    (_worst, "lower val_loss is better"), (_ceil, "round down"), (_eta_many, "you kept eta"),
    (_dropped_fraction, "you dropped 1/eta"), (_first_finished, "first results to arrive")])
def _promote_solution(results, eta):
    """The results that go on, as a learner writes it: the len(results) // eta lowest val_loss."""
    ranked = sorted(results, key=lambda r: (r["val_loss"], r["trial"]))
    return ranked[:len(results) // eta]


# --------------------------------------------------------------------------- build it: successive halving on the ranks
def _sh_variant(kind: str | None = None):
    """``fn(trials, objective, min_budget, eta, comm)``: the reference (None) or one typical mistake."""
    def fn(trials, objective, min_budget, eta, comm):
        rank, size = comm.Get_rank(), comm.Get_size()
        alive, budget, rungs = sorted(trials), min_budget, []
        while True:
            share = alive if kind == "all_train" else alive[rank::size]
            mine = [{"trial": t, "budget": budget, "val_loss": objective(t, budget)} for t in share]
            parts = comm.allgather(mine)
            if kind == "all_train":
                parts = [mine]
            if kind == "local_ties":                          # this rank's results first, ties by arrival
                parts = [mine] + [p for i, p in enumerate(parts) if i != rank]
            results = [r for p in parts for r in p]
            rungs.append((budget, list(alive)))
            keep = len(alive) // eta
            if keep < 1:
                return rungs
            if kind == "worst":
                key = lambda r: (-r["val_loss"], r["trial"])  # noqa: E731
            elif kind in ("local_ties", "arrival_ties"):
                key = lambda r: r["val_loss"]                 # noqa: E731  (stable: ties in arrival order)
            else:
                key = lambda r: (r["val_loss"], r["trial"])   # noqa: E731
            alive = sorted(r["trial"] for r in sorted(results, key=key)[:keep])
            budget = budget + min_budget if kind == "budget_add" else budget * (1 if kind == "budget_same" else eta)
    return fn


SH_VARIANTS = {kind: _sh_variant(kind) for kind in ("worst", "budget_same", "budget_add", "local_ties",
                                                    "arrival_ties", "all_train")}


@reference("sh_on_ranks", mistakes=[
    (SH_VARIANTS["worst"], "lower val_loss is better"), (SH_VARIANTS["budget_same"], "budget *= eta"),
    (SH_VARIANTS["local_ties"], "the ranks disagree"), (SH_VARIANTS["arrival_ties"], "smaller trial id"),
    (SH_VARIANTS["all_train"], "trained once per rung")])
def _sh_rungs_solution(trials, objective, min_budget, eta, comm):
    """Successive halving with the trials of each rung shared among the ranks; returns (budget, trials) per rung."""
    rank, size = comm.Get_rank(), comm.Get_size()
    alive, budget, rungs = sorted(trials), min_budget, []
    while True:
        mine = [{"trial": t, "budget": budget, "val_loss": objective(t, budget)} for t in alive[rank::size]]
        results = [r for part in comm.allgather(mine) for r in part]
        rungs.append((budget, list(alive)))
        keep = len(alive) // eta
        if keep < 1:
            return rungs
        ranked = sorted(results, key=lambda r: (r["val_loss"], r["trial"]))
        alive = sorted(r["trial"] for r in ranked[:keep])
        budget *= eta
