"""test_dist: rank 0 prints every rank's dist.local_rank() (under whatever Slurm variables the test sets)."""
from ddlcourse import dist
from mpi4py import MPI
lr = MPI.COMM_WORLD.gather(dist.local_rank(), root=0)
if MPI.COMM_WORLD.Get_rank() == 0: print(lr)
