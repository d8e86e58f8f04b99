"""Naive layer (model) parallelism against the serial model, forward and backward."""
import pytest

from ddlcourse.parallel.model_parallel import partition

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 4])
def test_model_parallel_matches_serial(n):
    p = run_ranks(n, "model_parallel_vs_serial")
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-6, p.stdout
    assert int(p.stdout.split("EVENTS")[1].split()[0]) == 2 * n


def test_partition():
    assert partition(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert partition(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError):
        partition(2, 3)


def test_on_first_ranks_raises_on_every_rank_when_one_fails():
    """A learner's bad input raised on ranks < k and left rank k waiting at the barrier forever (a cell that
    never returns); now every rank raises, and the ranks that did not fail say which did."""
    import json

    res = json.loads(run_ranks(3, "model_parallel_on_first_ranks_fails", timeout=120).stdout.split("RESULT")[1])
    for r in (0, 1):
        assert res[r]["mp"] == "ValueError: batch must be positive, got -1", res
    assert res[2]["mp"].startswith("PeerFailed: bad_input raised on rank(s) [0, 1]"), res
    assert res[0]["one"] == "KeyError: \"rank 0's own mistake\"", res
    assert all(res[r]["one"].startswith("PeerFailed: rank0_only raised on rank(s) [0]") for r in (1, 2)), res
    assert res[0]["rt"].startswith("ZeroDivisionError") and res[2]["rt"].startswith("PeerFailed"), res
