"""The from-scratch collectives against MPI.Allreduce, and the alpha-beta model on known answers."""
import numpy as np
import pytest

from ddlcourse import collectives as col

CODE = r"""
import numpy as np
import torch
from mpi4py import MPI
from ddlcourse import collectives as col
comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
worst = 0.0
for algo in ("ring", "recursive_doubling", "reduce_bcast"):
    for nelem in (0, 1, n - 1, n, 7, 1000, 4097):        # fewer elements than ranks, uneven chunks
        for dtype in (np.float64, np.int64):
            x = (np.arange(nelem) * (r + 1) + r).astype(dtype)
            ref = np.zeros(nelem, dtype)
            for k in range(n):                             # the known answer, computed serially
                ref += (np.arange(nelem) * (k + 1) + k).astype(dtype)
            got = col.ALGORITHMS[algo](x.copy(), comm)
            worst = max(worst, float(np.abs(got - ref).max()) if nelem else 0.0)
    worst = max(worst, col.check_against_mpi(algo, 999, comm=comm))
    y = np.ones((3, 5)) * r                                # a 2-D buffer keeps its shape
    got = col.ALGORITHMS[algo](y, comm)
    assert got.shape == (3, 5)
    worst = max(worst, float(np.abs(got - n * (n - 1) / 2).max()))
    # torch tensors too, reduced in place: a contiguous one (through a NumPy view) and a strided view (a copy);
    # a CUDA tensor takes the copy path as well (mpi4py needs host memory)
    tc = torch.full((5,), float(r), requires_grad=True)
    assert col.ALGORITHMS[algo](tc, comm) is tc
    worst = max(worst, float((tc.detach() - n * (n - 1) / 2).abs().max()))
    base = torch.arange(12.0).reshape(4, 3) * (r + 1)
    view = base.t()                                        # (3, 4), not contiguous
    col.ALGORITHMS[algo](view, comm)
    worst = max(worst, float((base - torch.arange(12.0).reshape(4, 3) * n * (n + 1) / 2).abs().max()))
ring = col.ring_pass(comm)
assert ring["value"] == (r - 1) % n
tour = col.collectives_tour(comm)
assert tour["allreduce"] == [n * (n + 1) / 2] * 2 and tour["bcast"] == [1.0, 1.0]
assert tour["allgather"] == [k + 1.0 for k in range(n)]
t = col.time_allreduce("ring", 4096, reps=2, comm=comm)
f = col.fusion_demo(4, 16, reps=1, comm=comm)
worst = comm.allreduce(worst, op=MPI.MAX)
if r == 0:
    print(worst)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_allreduce_algorithms_match_serial_sum(mpi, n):
    worst = float(mpi(n, CODE).stdout.strip().splitlines()[-1])
    assert worst < 1e-9, worst


def test_single_rank_is_identity():
    x = np.arange(5.0)
    for algo in ("ring", "recursive_doubling"):
        np.testing.assert_array_equal(col.ALGORITHMS[algo](x.copy()), x)


def test_fit_recovers_known_alpha_beta():
    sizes = np.logspace(2, 7, 12)
    alpha, beta = 20e-6, 1 / 5e9
    a, b = col.fit_alpha_beta(sizes, alpha + beta * sizes)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_model_time_known_answers():
    # ring on 4 ranks: 6 messages and 1.5x the bytes
    assert col.model_time("ring", 1000, 4, alpha=1.0, beta=0.01) == pytest.approx(6 + 15)
    assert col.model_time("recursive_doubling", 1000, 4, alpha=1.0, beta=0.01) == pytest.approx(2 * 11)
    assert col.model_time("reduce_bcast", 1000, 4, alpha=1.0, beta=0.01) == pytest.approx(4 * 11)
    with pytest.raises(ValueError):
        col.model_time("tree2", 1, 2, 1, 1)


def test_bandwidth_and_errors():
    assert col.bandwidth(1e9, 1.0, 2, "algo") == 1e9
    assert col.bandwidth(1e9, 1.0, 4) == pytest.approx(1.5e9)
    with pytest.raises(ValueError):
        col.bandwidth(1, 0, 2)
    with pytest.raises(ValueError, match="unknown allreduce"):
        col.time_allreduce("nope", 8)
    with pytest.raises(ValueError):
        col.fit_alpha_beta([1], [1])
