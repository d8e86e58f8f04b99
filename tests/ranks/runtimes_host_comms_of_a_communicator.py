"""test_runtimes: host_comms over the world in reverse order: hosts and leaders in that communicator's ranks,
cached; rank 0 prints what each rank got (a Python literal)."""
from mpi4py import MPI
from ddlcourse import runtimes
w = MPI.COMM_WORLD
rev = w.Split(0, -w.rank)                        # the world in reverse: rank 0 of rev is world rank 2
local, leaders = runtimes.host_comms(rev, 2)     # hosts of rev: [0, 1] and [2], i.e. world [2, 1] and [0]
got = (local.allgather(w.rank), None if leaders == MPI.COMM_NULL else leaders.allgather(w.rank))
again = runtimes.host_comms(rev, 2)
out = w.gather((got, again[0] is local), root=0)
if w.rank == 0:
    print(repr(out))
