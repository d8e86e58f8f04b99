"""The from-scratch collectives against MPI.Allreduce, and the alpha-beta model on known answers."""
import numpy as np
import pytest

from ddlcourse import collectives as col

from helpers import run_ranks


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_allreduce_algorithms_match_serial_sum(n):
    worst = float(run_ranks(n, "collectives_allreduce_algorithms").stdout.strip().splitlines()[-1])
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
