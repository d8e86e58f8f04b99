"""The coding exercise of notebook 13 (federated averaging): the server's weighted average, on real ranks."""

CODE = """
import torch
from ddlcourse import federated
from ddlcourse.exercises import nb13_federated as ex
v = run_checker("fedavg_round", lambda w, n, ar: federated.weighted_average(w, n))
assert v.ok, v.message
def mine(flat, n_local, allreduce):               # written here: weights n_k / n, two allreduces
    n = allreduce(torch.tensor([float(n_local)], dtype=flat.dtype))[0]
    return allreduce(flat * (n_local / n))
v = run_checker("fedavg_round", mine)
assert v.ok, v.message
for kind, hint in [("unweighted", "plain mean"), ("count_sum", "did not divide"), ("local_share", "share of all")]:
    reject("fedavg_round", ex._average_variant(kind), hint)
"""


def test_fedavg_round_checker_on_ranks(on_ranks):
    on_ranks(3, CODE)
