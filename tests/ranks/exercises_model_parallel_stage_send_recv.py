"""test_exercises_model_parallel: a step across the stages with another header (dimensions, then sizes) passes;
a summed loss and a backward from ones are named on every rank."""
from tests.ranks._on_ranks import finish, reject, run_checker

import torch
from ddlcourse.exercises.solutions import model_parallel as ex
def mine(stage, x, y, loss_fn, rank, world, send, recv):     # written here, as a learner would
    if rank == 0:
        inp = x
    else:
        ndim = torch.zeros(1, dtype=torch.long)               # the number of dimensions, then the sizes
        recv(ndim, rank - 1)
        sizes = torch.zeros(int(ndim), dtype=torch.long)
        recv(sizes, rank - 1)
        inp = torch.zeros(*sizes.tolist()).requires_grad_()
        recv(inp, rank - 1)
    out = stage(inp)
    if rank == world - 1:
        loss_fn(out, y).backward()
    else:
        send(torch.tensor([out.dim()]), rank + 1)
        send(torch.tensor(list(out.shape)), rank + 1)
        send(out, rank + 1)
        g = torch.zeros_like(out)
        recv(g, rank + 1)
        out.backward(g)
    if rank != 0:
        send(inp.grad, rank - 1)
v = run_checker("stage_send_recv", mine)
assert v.ok, v.message
reject("stage_send_recv", ex._step_variant("summed"), "times the number of stages")
reject("stage_send_recv", ex._step_variant("ones"), "backward from ones")

finish()
