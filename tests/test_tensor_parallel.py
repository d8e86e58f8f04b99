"""Megatron-style column/row-parallel linear layers against the serial MLP, forward and backward."""
import pytest

CODE = """
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.parallel import tensor
from ddlcourse.experiments import tensor as tensor_exp
dist.init()
d = tensor_exp.compare_with_serial(batch=6, dim=12, hidden=32)
worst = MPI.COMM_WORLD.allreduce(max(d.values()), op=MPI.MAX)
if dist.rank() == 0:
    print("WORST", worst)
dist.shutdown()
"""


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_parallel_matches_serial(mpi, n):
    p = mpi(n, CODE)
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-5, p.stdout


MESH = """
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
"""


def test_hybrid_mesh_matches_serial(mpi):
    p = mpi(4, MESH)
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-5, p.stdout
    assert "[(0, 0), (0, 1), (1, 0), (1, 1)]" in p.stdout
