"""test_model_parallel: layer parallelism against the serial model, forward and backward; rank 0 prints WORST
(the largest difference) and EVENTS (how many (rank, kind) pairs were recorded)."""
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import model_parallel as mp_exp
dist.init()
r = mp_exp.compare_with_serial(batch=16, n_layers=7)
worst = MPI.COMM_WORLD.allreduce(max(r["loss_diff"], r["grad_diff"]), op=MPI.MAX)
kinds = sorted({(e["rank"], e["kind"]) for e in r["events"]})
if dist.rank() == 0:
    print("WORST", worst)
    print("EVENTS", len(kinds))
dist.shutdown()
