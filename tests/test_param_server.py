"""The parameter server: synchronous PS = allreduce data parallelism = serial (1 and 2 servers, 2 and 4 ranks),
staleness emulation, traffic counted against the model, local SGD, and the push/pull exercise checker."""
import numpy as np
import pytest

from ddlcourse.parallel import param_server as ps

from ddlcourse.experiments import param_server as ps_exp

from helpers import run_ranks


def test_shard_bounds_cover_everything():
    b = ps.shard_bounds(10, 3)
    assert b[0][0] == 0 and b[-1][1] == 10 and all(x[1] == y[0] for x, y in zip(b, b[1:]))
    assert max(s - a for a, s in b) - min(s - a for a, s in b) <= 1
    with pytest.raises(ValueError, match="at least one server"):
        ps.shard_bounds(10, 0)


def test_staleness_zero_is_serial_sgd_and_staleness_changes_the_path():
    kw = dict(steps=6, global_batch=24, lr=0.5, n_train=48, dim=4, hidden=8)
    s0 = ps_exp.train_stale(0, **kw)
    serial = ps_exp.train_serial(**kw)
    assert np.abs(s0["params"] - serial["params"]).max() < 1e-12
    s2 = ps_exp.train_stale(2, **kw)
    assert np.abs(s2["params"] - serial["params"]).max() > 1e-6
    with pytest.raises(ValueError, match="staleness"):
        ps_exp.train_stale(-1)


def test_traffic_model():
    m = ps_exp.traffic_model(1000, n_ranks=5, n_servers=1)
    assert m["server"] == 4 * 8000 and m["worker"] == 8000          # bytes sent per step
    assert m["ring"] == pytest.approx(2 * 4 / 5 * 8000)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_sync_ps_equals_serial_and_allreduce(n):
    out = run_ranks(n, "param_server_sync_traffic_local_sgd").stdout
    sync, trs, n_stale, min_stale, d_local, at1, at3, b1, b3 = eval(out.strip().splitlines()[-1])
    for d in sync.values():
        assert d["ps_vs_serial"] < 1e-12 and d["allreduce_vs_serial"] < 1e-12, sync
    model = ps_exp.traffic_model(1000, n_ranks=n, n_servers=1)
    for r, t in enumerate(trs):
        assert t["role"] == ("server" if r == 0 else "worker")
        assert t["ps_bytes"] == model[t["role"]]            # bytes counted on the real messages
        assert t["ring_bytes"] == pytest.approx(model["ring"])
    assert n_stale == 3 * (n - 1) and min_stale == 0
    assert d_local < 1e-12                                  # local SGD with H = 1 is data parallelism
    assert at1 == list(range(1, 7)) and at3 == [3, 6]
    assert b3 == pytest.approx(b1 / 3)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_push_pull_exercise_checker(n):
    allv = eval(run_ranks(n, "param_server_push_pull_checker").stdout.strip().splitlines()[-1])
    assert all(r[0] == (True, "") and r[1] == (True, "") for r in allv)
    assert all(not r[2][0] and "push the gradient" in r[2][1] for r in allv)
    assert all(not r[3][0] and "never received" in r[3][1] for r in allv)
    assert all(not r[4][0] and "not written yet" in r[4][1] for r in allv)     # no rank waits for ever
