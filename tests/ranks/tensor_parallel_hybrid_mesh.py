"""test_tensor_parallel: data x tensor parallelism on a 2x2 mesh against the serial model; rank 0 prints WORST and
every rank's (dp, tp) coordinates."""
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import mesh as mesh_exp
dist.init()
d = mesh_exp.hybrid_compare_with_serial(dp=2, tp=2)
worst = MPI.COMM_WORLD.allreduce(max(d["loss_diff"], d["grad_diff"]), op=MPI.MAX)
coords = MPI.COMM_WORLD.gather((d["dp_rank"], d["tp_rank"]), root=0)
if dist.rank() == 0:
    print("WORST", worst)
    print("COORDS", coords)
dist.shutdown()
