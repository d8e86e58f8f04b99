"""test_federated: FedAvg with one full-batch step per round against centralized gradient descent, iid and
non-iid; rank 0 prints WORST and the largest difference."""
from mpi4py import MPI
from ddlcourse import dist, federated
dist.init()
d = max(federated.compare_with_serial(3, mode) for mode in ("iid", "noniid"))
d = MPI.COMM_WORLD.allreduce(d, op=MPI.MAX)
if dist.rank() == 0:
    print("WORST", d)
dist.shutdown()
