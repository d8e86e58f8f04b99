"""test_pipeline: GPipe and 1F1B with 1, 3 and 4 micro-batches against the serial model; rank 0 prints WORST (the
largest difference) and INFL (the most micro-batches in flight on stage 0 with 4, GPipe then 1F1B)."""
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import pipeline as pipeline_exp
dist.init()
worst, infl = 0.0, {}
for sched in ("gpipe", "1f1b"):
    for m in (1, 3, 4):
        r = pipeline_exp.compare_with_serial(num_micro_batches=m, micro_batch=4, n_layers=6, schedule=sched)
        worst = max(worst, r["loss_diff"], r["grad_diff"])
        infl[(sched, m)] = r["max_in_flight"]
worst = MPI.COMM_WORLD.allreduce(worst, op=MPI.MAX)
infl = MPI.COMM_WORLD.gather(infl, root=0)
if dist.rank() == 0:
    print("WORST", worst)
    print("INFL", infl[0][("gpipe", 4)], infl[0][("1f1b", 4)])
dist.shutdown()
