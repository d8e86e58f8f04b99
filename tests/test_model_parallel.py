"""Naive layer (model) parallelism against the serial model, forward and backward."""
import pytest

from ddlcourse.parallel.model_parallel import partition

CODE = """
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.experiments import model_parallel as mp_exp
dist.init()
r = mp_exp.compare_with_serial(batch=16, n_layers=7)
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


FAILS = """
import json
from ddlcourse import dist
def bad_input(batch, group=None):              # every rank of the subgroup rejects the input
    raise ValueError(f"batch must be positive, got {batch}")
def rank0_only(group=None):                    # one rank fails, its peer would go on to a collective
    if dist.rank() == 0:
        raise KeyError("rank 0's own mistake")
    return "fine"
out = {}
for name, call in [("mp", lambda: dist.on_first_ranks(2, bad_input, -1)),
                   ("one", lambda: dist.on_first_ranks(2, rank0_only)),
                   ("rt", lambda: dist.on_first_ranks(2, lambda comm=None: 1 / 0))]:
    try:
        call()
        out[name] = "returned"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
res = dist._comm().gather(out)
if dist.rank() == 0:
    print("RESULT" + json.dumps(res))
dist.shutdown()
"""


def test_on_first_ranks_raises_on_every_rank_when_one_fails(mpi):
    """A learner's bad input raised on ranks < k and left rank k waiting at the barrier forever (a cell that
    never returns); now every rank raises, and the ranks that did not fail say which did."""
    import json

    res = json.loads(mpi(3, FAILS, timeout=120).stdout.split("RESULT")[1])
    for r in (0, 1):
        assert res[r]["mp"] == "ValueError: batch must be positive, got -1", res
    assert res[2]["mp"].startswith("PeerFailed: bad_input raised on rank(s) [0, 1]"), res
    assert res[0]["one"] == "KeyError: \"rank 0's own mistake\"", res
    assert all(res[r]["one"].startswith("PeerFailed: rank0_only raised on rank(s) [0]") for r in (1, 2)), res
    assert res[0]["rt"].startswith("ZeroDivisionError") and res[2]["rt"].startswith("PeerFailed"), res
