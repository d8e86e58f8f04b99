"""test_exercises_collectives: a ring allreduce written another way passes the checker; a doubled result and one
wrong on integers only are described; the mine-vs-MPI timing table (printed by rank 0)."""
from tests.ranks._on_ranks import RANK, finish, run_checker

import numpy as np
from ddlcourse import collectives

def mine(buf, comm):                          # written from the contract: explicit bounds, fresh receive buffers
    r, n = comm.Get_rank(), comm.Get_size()
    flat = buf.reshape(-1)
    cut = [len(flat) * i // n for i in range(n + 1)]
    ch = [flat[cut[i]:cut[i + 1]] for i in range(n)]
    for s in range(n - 1):
        a, b = ch[(r - s) % n], ch[(r - s - 1) % n]
        b += comm.sendrecv(a.copy(), dest=(r + 1) % n, source=(r - 1) % n)
    for s in range(n - 1):
        a, b = ch[(r + 1 - s) % n], ch[(r - s) % n]
        b[:] = comm.sendrecv(a.copy(), dest=(r + 1) % n, source=(r - 1) % n)
    return buf
assert run_checker("ring_allreduce", mine).ok
assert run_checker("ring_allreduce", collectives.ring_allreduce).ok

def doubled(buf, comm):                       # a mistake the checker does not know by name
    mine(buf, comm)
    buf *= 2
    return buf
v = run_checker("ring_allreduce", doubled)
assert not v.ok and "MPI_Allreduce gives" in v.message, v.message

def floaty(buf, comm):                        # right on floats, wrong on integers
    if np.issubdtype(buf.dtype, np.integer):
        buf += 1
        return buf
    return mine(buf, comm)
v = run_checker("ring_allreduce", floaty)
assert not v.ok and "wrong on integer ones" in v.message, v.message

def unwritten(buf, comm):
    raise NotImplementedError
res = collectives.time_mine_vs_mpi(unwritten, [64, 1024], reps=2)
assert res["mine"] is None and "not written" in res["why"] and len(res["mpi"]) == 2
res = collectives.time_mine_vs_mpi(mine, [64, 1024], reps=2)
assert len(res["mine"]) == len(res["mpi"]) == 2 and all(t > 0 for t in res["mine"] + res["mpi"])
if RANK == 0:
    collectives.print_mine_vs_mpi(res)

finish()
