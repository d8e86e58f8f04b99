"""Naive layer (model) parallelism against the serial model, forward and backward."""
import pytest

from ddlcourse.parallel.model_parallel import partition

CODE = """
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.parallel import model_parallel as mp
dist.init(horovod=False)
r = mp.compare_with_serial(batch=16, n_layers=7)
worst = MPI.COMM_WORLD.allreduce(max(r["loss_diff"], r["grad_diff"]), op=MPI.MAX)
kinds = sorted({(e["rank"], e["kind"]) for e in r["events"]})
if dist.rank() == 0:
    print("WORST", worst)
    print("EVENTS", len(kinds))
dist.shutdown()
"""


@pytest.mark.parametrize("n", [2, 4])
def test_model_parallel_matches_serial(mpi, n):
    p = mpi(n, CODE)
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-6, p.stdout
    assert int(p.stdout.split("EVENTS")[1].split()[0]) == 2 * n


def test_partition():
    assert partition(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert partition(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError):
        partition(2, 3)
