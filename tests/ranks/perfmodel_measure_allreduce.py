"""test_perfmodel: perfmodel.measure_allreduce at three sizes; rank 0 prints RESULT and the times, as JSON."""
import json; from ddlcourse import perfmodel as pm; from mpi4py import MPI
t = pm.measure_allreduce([4096, 262144, 1048576], repeats=3)
if MPI.COMM_WORLD.rank == 0: print('RESULT', json.dumps(t))
