"""Notebook 09 counts traffic one way: the bytes each process SENDS per step. The model, the counted messages,
local SGD's bytes and exercise 2's references all use it (an earlier version mixed sent + received with sent)."""
import math

import pytest

from ddlcourse.exercises.checkers import parameter_server as ex
from ddlcourse.experiments import param_server as ps_exp

from helpers import run_ranks


def test_traffic_model_counts_bytes_sent():
    P = 1000 * 8
    m = ps_exp.traffic_model(1000, n_ranks=5, n_servers=1)
    assert m["server"] == 4 * P                          # its shard to each of W = 4 workers
    assert m["worker"] == P                              # its gradient
    assert m["ring"] == pytest.approx(2 * 4 / 5 * P)     # reduce-scatter + allgather: 2 (N-1) chunks of P/N
    assert ps_exp.traffic_model(1000, n_ranks=5, n_servers=2)["server"] == 3 * P / 2


def test_exercise_2_references():
    # 25 M float32 = 100 MB; 1 server, 15 workers: it sends 15 x 100 MB per step
    assert ex.ps_server_bytes(25_000_000, 15) == pytest.approx(1.5e9)
    # an allreduce rank among the 16 processes sends 2 x 15/16 x 100 MB = 187.5 MB; 1500 / S <= 187.5 at S = 8
    assert ex.ps_servers_to_match(25_000_000, 15) == 8
    for W in range(1, 40):
        S = ex.ps_servers_to_match(1000, W, 8)
        m = ps_exp.traffic_model(1000, W + 1, 1, 8)
        assert m["server"] / S <= m["ring"] * (1 + 1e-12)              # S servers are enough
        assert S == 1 or m["server"] / (S - 1) > m["ring"]             # and S - 1 are not
        assert S == math.ceil((W + 1) / 2)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [3, 4])
def test_counted_bytes_are_bytes_sent(n):
    tr, n_params, b1, b3 = eval(run_ranks(n, "ps_traffic_counted_bytes").stdout.strip().splitlines()[-1])
    model = ps_exp.traffic_model(1000, n_ranks=n, n_servers=1)
    for t in tr:
        assert t["ps_bytes"] == model[t["role"]]                      # counted sends = the model
        assert t["ps_received"] == t["ps_bytes"]                      # and each receives as much
        assert t["ring_bytes"] == pytest.approx(model["ring"], rel=0.01)
        assert t["ring_received"] == pytest.approx(t["ring_bytes"], rel=0.01)   # chunks of 334 and 333 elements
    ring = ps_exp.traffic_model(n_params, n_ranks=n)["ring"]              # float64 parameters, 8 bytes each
    assert b1 == pytest.approx(ring) and b3 == pytest.approx(ring / 3)
