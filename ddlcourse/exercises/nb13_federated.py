"""Exercises of notebooks/13_federated.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("fedavg_weight", "a device's weight is its share of all samples")
def fedavg_weight(counts, client: int) -> float:
    return counts[client] / sum(counts)


@exercise("fedavg_upload_mib", "clients x rounds x parameters x 4 bytes; 1 MiB = 2**20 bytes")
def fedavg_upload_mib(n_clients: int, n_params: int, rounds: int) -> float:
    return n_clients * rounds * n_params * 4 / 2**20
