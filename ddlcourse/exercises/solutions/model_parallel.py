"""Reference solutions of notebooks/15_model_parallel.ipynb: one model-parallel training step on one rank, and the
step with one typical mistake each (what its checker, :mod:`ddlcourse.exercises.checkers.model_parallel`, must
name)."""
import torch

from ddlcourse.selfcheck import reference


def stage_step_solution(stage, x, y, loss_fn, rank, world, send, recv):
    """Forward and backward of one batch through stage ``rank`` of ``world`` (see the notebook's template)."""
    if rank == 0:
        inp = x
    else:
        shape = torch.empty(2, dtype=torch.int64)
        recv(shape, rank - 1)                          # the shape first: the receiver allocates the buffer
        inp = torch.empty(shape.tolist())
        recv(inp, rank - 1)
        inp.requires_grad_(True)                       # so that backward fills inp.grad
    out = stage(inp)
    if rank < world - 1:
        send(torch.tensor(out.shape), rank + 1)
        send(out, rank + 1)
        grad_out = torch.empty_like(out)               # the gradient of out has out's shape: no header needed
        recv(grad_out, rank + 1)
        out.backward(grad_out)
    else:
        loss_fn(out, y).backward()
    if rank > 0:
        send(inp.grad, rank - 1)


def _step_variant(kind: str):
    """The solution with one typical mistake ``kind``: "no_grad_back", "no_requires_grad", "wrong_neighbour",
    "guessed_shape", "ones" (backward from ones) or "summed" (the loss scaled by the number of stages)."""
    def step(stage, x, y, loss_fn, rank, world, send, recv):
        if rank == 0:
            inp = x
        else:
            if kind == "guessed_shape":                # no header: a shape remembered from another model
                inp = torch.empty(12, 16)
            else:
                shape = torch.empty(2, dtype=torch.int64)
                recv(shape, rank - 1)
                inp = torch.empty(shape.tolist())
            recv(inp, rank - 1)
            if kind != "no_requires_grad":
                inp.requires_grad_(True)
        out = stage(inp)
        if rank < world - 1:
            if kind != "guessed_shape":
                send(torch.tensor(out.shape), rank + 1)
            send(out, rank + 1)
            grad_out = torch.empty_like(out)
            recv(grad_out, rank + 1)
            if kind == "ones":
                out.backward(torch.ones_like(out))
            else:
                out.backward(grad_out)
        else:
            (loss_fn(out, y) * (world if kind == "summed" else 1)).backward()
        if rank > 0 and kind != "no_grad_back":
            send(inp.grad, rank + 1 if kind == "wrong_neighbour" else rank - 1)
    step.__name__ = f"stage_step_{kind}"
    return step


# The fragments are the first 40 characters of the checker's hints (HINTS in the checker module).
reference("stage_send_recv", mistakes=[
    (_step_variant("no_grad_back"), "the gradient is not sent back: after bac"),
    (_step_variant("no_requires_grad"), "inp.grad is None: call requires_grad_(Tr"),
    (_step_variant("wrong_neighbour"), "wrong neighbour: activations go to rank "),
    (_step_variant("guessed_shape"), "the shape was not communicated: the rece"),
    (_step_variant("ones"), "on a stage before the last, call out.bac")])(stage_step_solution)
