"""The coding exercise of notebook 05 (data parallelism): the gradient hook, on real ranks."""

CODE = """
import torch.distributed as tdist
from ddlcourse.exercises import nb05_data_parallel as ex
from ddlcourse.parallel import data_parallel as dp
v = run_checker("average_grad_hook", dp.average_grad_hook)
assert v.ok, v.message
def mine(p):                                   # a correct hook written from the contract
    p.grad.copy_(p.grad / tdist.get_world_size())
    tdist.all_reduce(p.grad)
assert run_checker("average_grad_hook", mine).ok
reject("average_grad_hook", ex._hook_sum, "summed the gradients")
reject("average_grad_hook", ex._hook_local, "never communicated")
reject("average_grad_hook", ex._hook_params, "p.data")
"""


def test_average_grad_hook_checker_on_ranks(on_ranks):
    on_ranks(2, CODE)
