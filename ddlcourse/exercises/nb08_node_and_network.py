"""Exercises of notebooks/08_node_and_network.ipynb."""
import numpy as np

from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- build it: the hierarchical allreduce
def hierarchical_allreduce(buf, comm, ranks_per_host):
    """The reference a learner would write: split ``comm`` into hosts of ``ranks_per_host`` ranks and their
    leaders, reduce to each leader, all-reduce among the leaders, broadcast inside each host."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    r = comm.Get_rank()
    local = comm.Split(r // ranks_per_host, key=r)                     # the ranks of my host, in rank order
    is_leader = local.Get_rank() == 0
    leaders = comm.Split(0 if is_leader else MPI.UNDEFINED, key=r)     # one rank per host; COMM_NULL elsewhere
    if is_leader:
        local.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)            # 1. the host's sum lands on its leader
        leaders.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)               # 2. the leaders add up the hosts' sums
        leaders.Free()
    else:
        local.Reduce(buf, None, op=MPI.SUM, root=0)
    local.Bcast(buf, root=0)                                           # 3. the leader hands the total to its host
    local.Free()
    return buf


def _hier_variant(world_allreduce=False, bcast=True, reduce=True, swapped=False):
    """The hierarchical allreduce with one typical mistake (none of them hangs)."""
    def hier(buf, comm, ranks_per_host):
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
        r = comm.Get_rank()
        local = comm.Split(r, key=r // ranks_per_host) if swapped else comm.Split(r // ranks_per_host, key=r)
        is_leader = local.Get_rank() == 0
        leaders = comm.Split(0 if is_leader else MPI.UNDEFINED, key=r)
        if reduce:
            local.Reduce(MPI.IN_PLACE if is_leader else buf, buf if is_leader else None, op=MPI.SUM, root=0)
        if world_allreduce:
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        elif is_leader:
            leaders.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        if bcast:
            local.Bcast(buf, root=0)
        if is_leader:
            leaders.Free()
        local.Free()
        return buf
    return hier


_world_allreduce = _hier_variant(world_allreduce=True)
_no_bcast = _hier_variant(bcast=False)
_no_reduce = _hier_variant(reduce=False)
_swapped_split = _hier_variant(swapped=True)

HIER_MISTAKES = {
    "the data of the ranks beside the leader is counted twice: the allreduce between hosts ran over the whole "
    "comm; run it over the leaders' communicator, on the leaders only": _world_allreduce,
    "the ranks beside the leader keep their own data: broadcast the total from the leader inside each host":
        _no_bcast,
    "the leaders added up only their own data: first reduce each host's data onto its leader": _no_reduce,
}


class _SplitRecorder:
    """Passes every call on to ``comm``; records who ends up together in each ``Split``."""

    def __init__(self, comm):
        self._comm, self.groups = comm, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Split(self, color=0, key=0):
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
        new = self._comm.Split(color, key)
        self.groups.append(None if new == MPI.COMM_NULL else new.allgather(self._comm.Get_rank()))
        return new



@code_exercise("hierarchical_allreduce", distributed=True, solution=hierarchical_allreduce, ranks=(2, 3, 4),
               mistakes=[(_world_allreduce, "counted twice"), (_no_bcast, "broadcast the total"),
                         (_no_reduce, "first reduce"), (_swapped_split, "colour")])
def check_hierarchical(fn, **_):
    """On every rank, with hosts of N ranks, of 1 rank and of 2 ranks (3 ranks: hosts of 2 and 1): ``fn`` must give
    MPI_Allreduce's sum, and its Split calls must put rank r with the ranks of its host (r // ranks_per_host)
    and the leaders (local rank 0 of each host) together (the first Split: the host's ranks)."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    for k in sorted({n, 1, 2} if n >= 3 else {n, 1}, reverse=True):
        x = np.random.default_rng([11, k, r]).standard_normal(7)
        flat = np.empty_like(x)
        comm.Allreduce(x, flat, op=MPI.SUM)
        wrong = {hint: f(x.copy(), comm, k) for hint, f in HIER_MISTAKES.items()}
        rec = _SplitRecorder(comm)
        ans = fn(x.copy(), rec, k)
        comm.Barrier()
        v = diagnose(np.asarray(_returned(ans, x)), flat, wrong, rtol=1e-10, atol=1e-12,
                     what=f"the result with {k} rank(s) per host")
        host = [q for q in range(n) if q // k == r // k]
        if v.ok and rec.groups and rec.groups[0] != host:       # the first Split makes the host communicator
            v = Verdict(False, f"with ranks_per_host={k} your host communicator holds ranks {rec.groups[0]}, "
                               f"but rank {r}'s host "
                               f"is ranks {host}: Split's colour (its first argument) picks the group, r // "
                               "ranks_per_host; the key only orders the ranks inside it")
        leaders = list(range(0, n, k))
        if v.ok and rec.groups and r in leaders and leaders not in rec.groups:
            v = Verdict(False, f"with ranks_per_host={k} the leaders are ranks {leaders}, but no Split of yours put "
                               "them together: colour 0 on local rank 0, MPI.UNDEFINED on the others")
        v = agreed(v, comm)
        if not v.ok:                     # every rank stops at the same split (the calls are collective)
            return v
    return Verdict(True)


def _returned(ans, x):
    """The learner's return value (None when the function forgot ``return buf``: then say so)."""
    if ans is None:
        raise ValueError("your function returned None: return buf")
    return ans
