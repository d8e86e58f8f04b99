"""test_dist: rank 0 prints how many distinct rendezvous (address, port) the ranks saw, the address, and whether
the port is one the OS gave."""
from ddlcourse import dist
from mpi4py import MPI
info = dist.init()
addr, port = dist.rendezvous()
seen = MPI.COMM_WORLD.gather((addr, port), root=0)
dist.shutdown()
if info.rank == 0: print(len(set(seen)), seen[0][0], seen[0][1] > 0)
