"""Communication runtimes: hierarchical allreduce equals the flat one (real and emulated hosts), gloo and MPI
measured side by side (shapes only, never a timing), the 8-GPU model and nccl-tests' bus-bandwidth factors,
and the hierarchical-allreduce exercise checker."""
import math

import pytest

from ddlcourse import runtimes


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


HIER = r"""
from mpi4py import MPI
from ddlcourse import runtimes
c = MPI.COMM_WORLD
rows = [runtimes.hierarchical_check(k) for k in (None, 1, 2, c.size)]
t = runtimes.time_hierarchical(4096, 2, reps=2)
bw = runtimes.bandwidths_at(1 << 16, reps=2)
if c.rank == 0:
    print(repr((rows, t, bw)))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_hierarchical_equals_flat(mpi, n):
    rows, t, bw = eval(mpi(n, HIER).stdout.strip().splitlines()[-1])
    assert all(r["max_diff"] < 1e-12 for r in rows), rows
    assert rows[0]["hosts"] == 1                               # COMM_TYPE_SHARED: one real host here
    assert [r["hosts"] for r in rows[1:]] == [n, n // 2, 1]    # emulated: rank // k
    assert set(t) == {"flat", "hierarchical"} and all(v > 0 for v in t.values())
    f = runtimes.bus_bandwidth_factor("all_reduce", n)
    for v in bw.values():
        assert v["busbw"] == pytest.approx(v["algbw"] * f)


SUB = r"""
from mpi4py import MPI
from ddlcourse import runtimes
w = MPI.COMM_WORLD
rev = w.Split(0, -w.rank)                        # the world in reverse: rank 0 of rev is world rank 2
local, leaders = runtimes.host_comms(rev, 2)     # hosts of rev: [0, 1] and [2], i.e. world [2, 1] and [0]
got = (local.allgather(w.rank), None if leaders == MPI.COMM_NULL else leaders.allgather(w.rank))
again = runtimes.host_comms(rev, 2)
out = w.gather((got, again[0] is local), root=0)
if w.rank == 0:
    print(repr(out))
"""


@pytest.mark.mpi
def test_host_comms_follow_the_ranks_of_the_given_communicator(mpi):
    """Hosts and leaders are counted in ``comm``'s ranks and order (not the world's), uneven hosts included;
    the communicators are the grid's cached ones (a second call returns the same)."""
    out = eval(mpi(3, SUB).stdout.strip().splitlines()[-1])
    assert [got for got, _ in out] == [([0], [2, 0]), ([2, 1], None), ([2, 1], [2, 0])], out
    assert all(same for _, same in out), out


GLOO = r"""
from mpi4py import MPI
from ddlcourse import dist, runtimes
dist.init()
res = runtimes.compare_gloo_mpi([256, 1 << 16, 1 << 18], reps=2)
fit = runtimes.fit_both(res)
dist.shutdown()
if MPI.COMM_WORLD.rank == 0:
    print(repr((res, fit)))
"""


@pytest.mark.mpi
def test_gloo_and_mpi_measured_side_by_side(mpi):
    res, fit = eval(mpi(2, GLOO).stdout.strip().splitlines()[-1])
    assert res["world_size"] == 2 and len(res["gloo"]) == len(res["mpi"]) == 3
    assert all(t > 0 for w in ("gloo", "mpi") for t in res[w])
    assert set(fit) == {"gloo", "mpi"} and all(a >= 0 and b >= 0 for a, b in fit.values())


EXERCISE = r"""
from mpi4py import MPI
from ddlcourse import selfcheck
from ddlcourse.runtimes import hierarchical_allreduce, host_comms

def package(buf, comm, ranks_per_host):     # the package's phases on the package's communicators (ddlcourse.grid's)
    local, leaders = host_comms(comm, ranks_per_host)
    hierarchical_allreduce(buf, local, leaders)
    return buf

def mine(buf, comm, ranks_per_host):        # a correct solution written differently: Allreduce inside, then bcast
    r = comm.Get_rank()
    local = comm.Split(r // ranks_per_host, r)
    leaders = comm.Split(0 if local.Get_rank() == 0 else MPI.UNDEFINED, r)
    local.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    if leaders != MPI.COMM_NULL:
        tot = buf.copy(); leaders.Allreduce(buf, tot, op=MPI.SUM); buf[...] = tot
    local.Bcast(buf, root=0)
    return buf

def no_return(buf, comm, ranks_per_host):
    package(buf, comm, ranks_per_host)

v = [selfcheck.run_checker("hierarchical_allreduce", f) for f in (package, mine, no_return)]
allv = MPI.COMM_WORLD.gather([(x.ok, x.message) for x in v], root=0)
if MPI.COMM_WORLD.rank == 0:
    print(repr(allv))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_hierarchical_exercise_checker(mpi, n):
    """The registered mistakes are run by tests/test_build_it.py; here: correct variants pass, a missing return is named."""
    allv = eval(mpi(n, EXERCISE).stdout.strip().splitlines()[-1])
    for per_rank in allv:
        assert per_rank[0] == (True, "") and per_rank[1] == (True, ""), per_rank
        assert not per_rank[2][0] and "return buf" in per_rank[2][1], per_rank
