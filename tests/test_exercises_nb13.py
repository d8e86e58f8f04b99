"""The coding exercise of notebook 13 (federated averaging): the server's weighted average, on real ranks."""

CODE = """
import torch
import torch.distributed as tdist
from ddlcourse import dist
from ddlcourse.exercises import nb13_federated as ex
from ddlcourse.selfcheck import run_checker
v = run_checker("fedavg_round", lambda w, n, ar: __import__("ddlcourse.federated").federated.weighted_average(w, n))
assert v.ok, v.message
def mine(flat, n_local, allreduce):               # written here: weights n_k / n, two allreduces
    n = allreduce(torch.tensor([float(n_local)], dtype=flat.dtype))[0]
    return allreduce(flat * (n_local / n))
v = run_checker("fedavg_round", mine)
assert v.ok, v.message
for kind, hint in [("unweighted", "plain mean"), ("count_sum", "did not divide"), ("local_share", "share of all")]:
    v = run_checker("fedavg_round", ex._average_variant(kind))
    assert not v.ok and hint in v.message, (kind, v.message)
from mpi4py import MPI
oks = MPI.COMM_WORLD.gather(dist.rank())
if dist.rank() == 0:
    print("checked on ranks", sorted(oks))
dist.shutdown()
"""


def test_fedavg_round_checker_on_ranks(mpi):
    out = mpi(3, CODE).stdout
    assert "checked on ranks [0, 1, 2]" in out, out
