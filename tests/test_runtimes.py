"""Communication runtimes: hierarchical allreduce equals the flat one (real and emulated hosts), gloo and MPI
measured side by side (shapes only, never a timing), the 8-GPU model and nccl-tests' bus-bandwidth factors,
and the hierarchical-allreduce exercise checker."""
import math

import pytest

from ddlcourse import runtimes

from helpers import run_ranks


def test_bus_factors_follow_nccl_tests():
    assert runtimes.bus_bandwidth_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert runtimes.bus_bandwidth_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert runtimes.bus_bandwidth_factor("broadcast", 16) == 1.0
    assert runtimes.bus_bandwidth_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        runtimes.bus_bandwidth_factor("alltoall", 4)
    with pytest.raises(ValueError, match="n must be"):
        runtimes.bus_bandwidth_factor("all_reduce", 0)


def test_hierarchy_model():
    one_node = runtimes.hierarchy_model(100e6, nodes=1)
    # inside one node the flat ring is one ring allreduce = one reduce-scatter + one allgather
    assert one_node["reduce-scatter / allreduce / allgather"] == pytest.approx(one_node["flat ring"])
    m = runtimes.hierarchy_model(100e6, nodes=16)
    # the leaders-only scheme pushes the whole message through one adapter per node: slowest at this size
    assert m["reduce / allreduce / bcast"] > m["reduce-scatter / allreduce / allgather"]
    assert all(v > 0 and math.isfinite(v) for v in m.values())


def test_host_comms_rejects_bad_split():
    with pytest.raises(ValueError, match="ranks_per_host"):
        runtimes.host_comms(ranks_per_host=0)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_hierarchical_equals_flat(n):
    rows, t, bw = eval(run_ranks(n, "runtimes_hierarchical_vs_flat").stdout.strip().splitlines()[-1])
    assert all(r["max_diff"] < 1e-12 for r in rows), rows
    assert rows[0]["hosts"] == 1                               # COMM_TYPE_SHARED: one real host here
    assert [r["hosts"] for r in rows[1:]] == [n, n // 2, 1]    # emulated: rank // k
    assert set(t) == {"flat", "hierarchical"} and all(v > 0 for v in t.values())
    f = runtimes.bus_bandwidth_factor("all_reduce", n)
    for v in bw.values():
        assert v["busbw"] == pytest.approx(v["algbw"] * f)


@pytest.mark.mpi
def test_host_comms_follow_the_ranks_of_the_given_communicator():
    """Hosts and leaders are counted in ``comm``'s ranks and order (not the world's), uneven hosts included;
    the communicators are the grid's cached ones (a second call returns the same)."""
    out = eval(run_ranks(3, "runtimes_host_comms_of_a_communicator").stdout.strip().splitlines()[-1])
    assert [got for got, _ in out] == [([0], [2, 0]), ([2, 1], None), ([2, 1], [2, 0])], out
    assert all(same for _, same in out), out


@pytest.mark.mpi
def test_gloo_and_mpi_measured_side_by_side():
    res, fit = eval(run_ranks(2, "runtimes_gloo_and_mpi").stdout.strip().splitlines()[-1])
    assert res["world_size"] == 2 and len(res["gloo"]) == len(res["mpi"]) == 3
    assert all(t > 0 for w in ("gloo", "mpi") for t in res[w])
    assert set(fit) == {"gloo", "mpi"} and all(a >= 0 and b >= 0 for a, b in fit.values())


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_hierarchical_exercise_checker(n):
    """The registered mistakes are run by tests/test_build_it.py; here: correct variants pass, a missing return is named."""
    allv = eval(run_ranks(n, "runtimes_hierarchical_checker").stdout.strip().splitlines()[-1])
    for per_rank in allv:
        assert per_rank[0] == (True, "") and per_rank[1] == (True, ""), per_rank
        assert not per_rank[2][0] and "return buf" in per_rank[2][1], per_rank
