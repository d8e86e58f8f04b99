"""FedAvg: equals centralized gradient descent in the one-full-batch-step limit; partitions are sound."""
import numpy as np
import pytest

from ddlcourse import federated

from helpers import run_ranks


@pytest.mark.parametrize("n", [2, 4])
def test_fedavg_one_step_equals_centralized(n):
    p = run_ranks(n, "federated_one_step")
    assert float(p.stdout.split("WORST")[1].split()[0]) < 1e-5, p.stdout


def test_partitions_cover_data_once_and_noniid_is_skewed():
    X, Y, _, _ = federated.data(1000, 10)
    for mode in ("iid", "noniid"):
        parts = federated.partition(Y, 4, mode, alpha=0.1)
        allidx = np.concatenate(parts)
        assert sorted(allidx.tolist()) == list(range(1000))
    h_iid = federated.label_histogram(Y, federated.partition(Y, 4, "iid"))
    h_non = federated.label_histogram(Y, federated.partition(Y, 4, "noniid", alpha=0.1))
    share = lambda h: (h.max(1) / np.maximum(h.sum(1), 1)).mean()   # share of the most common class
    assert share(h_non) > share(h_iid) + 0.2
    with pytest.raises(ValueError):
        federated.partition(Y, 4, "weird")
