"""test_runtimes: gloo's and MPI's allreduce measured side by side and fitted; rank 0 prints them (a Python
literal)."""
from mpi4py import MPI
from ddlcourse import dist, runtimes
dist.init()
res = runtimes.compare_gloo_mpi([256, 1 << 16, 1 << 18], reps=2)
fit = runtimes.fit_both(res)
dist.shutdown()
if MPI.COMM_WORLD.rank == 0:
    print(repr((res, fit)))
