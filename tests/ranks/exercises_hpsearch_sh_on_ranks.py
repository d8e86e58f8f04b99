"""test_exercises_hpsearch: successive halving with contiguous shares of the trials passes the check."""
from tests.ranks._on_ranks import finish, run_checker

def blocks(trials, objective, min_budget, eta, comm):     # contiguous shares, results as (loss, id) pairs
    rank, size = comm.Get_rank(), comm.Get_size()
    alive, budget, out = sorted(trials), min_budget, []
    while alive:
        out.append((budget, alive))
        per = -(-len(alive) // size)
        mine = [(objective(t, budget), t) for t in alive[rank * per:(rank + 1) * per]]
        everything = sorted(sum(comm.allgather(mine), []))
        alive = sorted(t for _, t in everything[:len(alive) // eta])
        budget *= eta
    return out
v = run_checker("sh_on_ranks", blocks)
assert v.ok, v.message

finish()
