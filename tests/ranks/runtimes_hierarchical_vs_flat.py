"""test_runtimes: the hierarchical allreduce against the flat one with real and emulated hosts, its timing, and the
bandwidths; rank 0 prints them (a Python literal)."""
from mpi4py import MPI
from ddlcourse import runtimes
c = MPI.COMM_WORLD
rows = [runtimes.hierarchical_check(k) for k in (None, 1, 2, c.size)]
t = runtimes.time_hierarchical(4096, 2, reps=2)
bw = runtimes.bandwidths_at(1 << 16, reps=2)
if c.rank == 0:
    print(repr((rows, t, bw)))
