"""Exercises of notebooks/04b_comm_runtimes.ipynb."""
import numpy as np

from ddlcourse.runtimes import free_host_comms, hierarchical_allreduce, host_comms
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose


def _no_bcast(buf, local, leaders):
    """Mistake: reduce and allreduce, but the leader never hands the total back to its host."""
    from mpi4py import MPI
    if local.Get_rank() == 0:
        local.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
        leaders.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    else:
        local.Reduce(buf, None, op=MPI.SUM, root=0)
    return buf


def _no_inter(buf, local, leaders):
    """Mistake: the hosts' sums are never added up across hosts."""
    from mpi4py import MPI
    if local.Get_rank() == 0:
        local.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
    else:
        local.Reduce(buf, None, op=MPI.SUM, root=0)
    local.Bcast(buf, root=0)
    return buf


def _no_reduce(buf, local, leaders):
    """Mistake: the leaders all-reduce their own data only."""
    from mpi4py import MPI
    if local.Get_rank() == 0:
        leaders.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    local.Bcast(buf, root=0)
    return buf


def _splits(n: int) -> list[int]:
    """Emulated ranks per host to try: one host of all ranks, one rank per host, and 2 per host when it fits."""
    out = [n, 1]
    if n >= 4 and n % 2 == 0:
        out.append(2)
    return out


@code_exercise("hierarchical_allreduce", distributed=True)
def check_hierarchical(fn, **_):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    for k in _splits(comm.Get_size()):
        local, leaders = host_comms(comm, ranks_per_host=k)
        x = np.random.default_rng(11 + 1000 * r).standard_normal(7)
        runs = {}
        for name, f in (("ref", hierarchical_allreduce), ("no_bcast", _no_bcast), ("no_inter", _no_inter),
                        ("no_reduce", _no_reduce)):
            runs[name] = f(x.copy(), local, leaders)
        try:
            ans = fn(x.copy(), local, leaders)
        finally:
            comm.Barrier()
            free_host_comms(local, leaders)
        v = diagnose(ans, runs["ref"], {
            "the ranks beside the leader keep their own data: broadcast the total from the leader inside each host":
                runs["no_bcast"],
            "each host has only its own sum: all-reduce the host sums among the leaders": runs["no_inter"],
            "the leaders added up only their own data: first reduce each host's data onto its leader": runs["no_reduce"],
        }, what=f"the result with {k} rank(s) per host")
        if not comm.allreduce(v.ok, op=MPI.LAND):   # every rank stops at the same split (the calls are collective)
            return v
    return Verdict(True)
