"""Reference solutions of notebooks/08_node_and_network.ipynb: the hierarchical allreduce as a learner writes it, and
with one typical mistake each (what its checker, :mod:`ddlcourse.exercises.checkers.node_and_network`, must name)."""
from ddlcourse.selfcheck import reference


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

# The ones the checker runs to name them (it tells a swapped Split by the communicators it makes).
HIER_VARIANTS = {"world_allreduce": _world_allreduce, "no_bcast": _no_bcast, "no_reduce": _no_reduce}

reference("hierarchical_allreduce", mistakes=[
    (_world_allreduce, "counted twice"), (_no_bcast, "broadcast the total"), (_no_reduce, "first reduce"),
    (_swapped_split, "colour")])(hierarchical_allreduce)
