"""The coding exercise of notebook 05 (data parallelism): the gradient hook, on real ranks."""

CODE = """
import torch
import torch.distributed as tdist
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.exercises import nb05_data_parallel as ex
from ddlcourse.parallel import data_parallel as dp
from ddlcourse.selfcheck import run_checker
v = run_checker("average_grad_hook", dp.average_grad_hook)
assert v.ok, v.message
def mine(p):                                   # a correct hook written from the contract
    p.grad.copy_(p.grad / tdist.get_world_size())
    tdist.all_reduce(p.grad)
assert run_checker("average_grad_hook", mine).ok
for wrong, hint in [(ex._hook_sum, "summed the gradients"), (ex._hook_local, "never communicated"),
                    (ex._hook_params, "p.data")]:
    v = run_checker("average_grad_hook", wrong)
    assert not v.ok and hint in v.message, v.message
oks = MPI.COMM_WORLD.gather(dist.rank())
if dist.rank() == 0:
    print("checked on ranks", sorted(oks))
dist.shutdown()
"""


def test_average_grad_hook_checker_on_ranks(mpi):
    out = mpi(2, CODE).stdout
    assert "checked on ranks [0, 1]" in out, out
