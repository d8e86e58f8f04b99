"""test_expert_parallel: expert parallelism against the serial MoE with the same routing at three capacity
factors; rank 0 prints RESULT and every rank's differences, drops and loads, as JSON."""
import json
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import expert as expert_exp
dist.init()
out = [expert_exp.compare_with_serial(capacity_factor=cf, skew=1.0) for cf in (0.75, 1.0, 4.0)]
res = MPI.COMM_WORLD.gather(out, root=0)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
