"""test_runtimes: the hierarchical-allreduce checker on the package's phases, a solution written differently and
one that does not return; rank 0 prints every rank's verdicts (a Python literal)."""
from mpi4py import MPI
from ddlcourse import selfcheck
from ddlcourse.runtimes import hierarchical_allreduce, host_comms

def package(buf, comm, ranks_per_host):     # the package's phases on the package's communicators (ddlcourse.grid's)
    local, leaders = host_comms(comm, ranks_per_host)
    hierarchical_allreduce(buf, local, leaders)
    return buf

def mine(buf, comm, ranks_per_host):        # a correct solution written differently: Allreduce inside, then bcast
    r = comm.Get_rank()
    local = comm.Split(r // ranks_per_host, r)
    leaders = comm.Split(0 if local.Get_rank() == 0 else MPI.UNDEFINED, r)
    local.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    if leaders != MPI.COMM_NULL:
        tot = buf.copy(); leaders.Allreduce(buf, tot, op=MPI.SUM); buf[...] = tot
    local.Bcast(buf, root=0)
    return buf

def no_return(buf, comm, ranks_per_host):
    package(buf, comm, ranks_per_host)

v = [selfcheck.run_checker("hierarchical_allreduce", f) for f in (package, mine, no_return)]
allv = MPI.COMM_WORLD.gather([(x.ok, x.message) for x in v], root=0)
if MPI.COMM_WORLD.rank == 0:
    print(repr(allv))
