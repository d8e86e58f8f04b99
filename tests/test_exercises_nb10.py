"""The coding exercise of notebook 10 (model parallelism): send/recv of activations and gradients, on real ranks."""

CODE = """
from ddlcourse.exercises import nb10_model_parallel as ex
def mine(stage, x, y, loss_fn, rank, world, send, recv):     # written here, as a learner would
    inp = x if rank == 0 else recv(rank - 1).requires_grad_(True)
    out = stage(inp)
    if rank < world - 1:
        send(out, rank + 1)
        out.backward(recv(rank + 1))
    else:
        loss_fn(out, y).backward()
    if rank > 0:
        send(inp.grad, rank - 1)
v = run_checker("stage_send_recv", mine)
assert v.ok, v.message
# the last stage's "ones" variant is right there: the exercise is right only if every rank is
reject_somewhere("stage_send_recv", ex._step_variant("ones"), "backward from ones")
reject_somewhere("stage_send_recv", ex._step_variant("summed"), "times the number of stages")
"""


def test_stage_send_recv_checker_on_ranks(on_ranks):
    on_ranks(3, CODE)
