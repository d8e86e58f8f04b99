"""Checkers of notebooks/08_node_and_network.ipynb: the hierarchical allreduce the learner builds, checked against
MPI_Allreduce and the communicators its Split calls make."""
import numpy as np

from ddlcourse.exercises.solutions.node_and_network import HIER_VARIANTS
from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose


# --------------------------------------------------------------------------- build it: the hierarchical allreduce
HIER_HINTS = {
    "world_allreduce":
        "the data of the ranks beside the leader is counted twice: the allreduce between hosts ran over the whole "
        "comm; run it over the leaders' communicator, on the leaders only",
    "no_bcast": "the ranks beside the leader keep their own data: broadcast the total from the leader inside each host",
    "no_reduce": "the leaders added up only their own data: first reduce each host's data onto its leader",
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


@code_exercise("hierarchical_allreduce", distributed=True, ranks=(2, 3, 4))
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
        wrong = {hint: HIER_VARIANTS[kind](x.copy(), comm, k) for kind, hint in HIER_HINTS.items()}
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
