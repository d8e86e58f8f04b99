"""Exercises of notebooks/10_model_parallel.ipynb."""
import numpy as np
import torch

from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("naive_idle_fraction", "one stage works at a time: each rank works 1/p of the time")
def naive_idle_fraction(num_stages: int) -> float:
    return (num_stages - 1) / num_stages


@exercise("model_parallel_messages", "p-1 boundaries, one activation forward and one gradient backward across each")
def model_parallel_messages(num_stages: int) -> int:
    return 2 * (num_stages - 1)


# --------------------------------------------------------------------------- coding exercise: send/recv between stages
def _step_variant(kind: str):
    """Typical wrong stage steps ``(stage, x, y, loss_fn, rank, world, send, recv)`` (none of them deadlocks)."""
    def step(stage, x, y, loss_fn, rank, world, send, recv):
        inp = x if rank == 0 else recv(rank - 1).requires_grad_(True)
        out = stage(inp)
        if rank < world - 1:
            send(out, rank + 1)
            grad_out = recv(rank + 1)
            if kind == "ones":                    # backward without the gradient that came back
                out.backward(torch.ones_like(out))
            elif kind == "summed":                # the loss scaled by the number of stages
                out.backward(grad_out * world)
        else:
            loss = loss_fn(out, y)
            (loss * (world if kind == "summed" else 1)).backward()
        if rank > 0:
            send(inp.grad, rank - 1)
    return step


@code_exercise("stage_send_recv", distributed=True)
def check_stage_send_recv(fn, **_) -> Verdict:
    """On every rank (rank r runs stage r): ``fn(stage, x, y, loss_fn, rank, world, send, recv)`` does one forward
    and backward across the stages: ``send(t, dst)`` sends a tensor to rank ``dst``, ``recv(src)`` returns the
    tensor rank ``src`` sent. Checked by the gradients of this rank's parameters against the serial model
    (``model_parallel.compare_with_serial`` does the same with ``model_parallel.train_step``)."""
    import torch
    from torch import nn

    from ddlcourse import dist
    from ddlcourse.data.toy import teacher_classification
    from ddlcourse.parallel import model_parallel as mp
    info = dist.init(horovod=False)
    r, p = dist.rank(), dist.world_size()
    dev = info.device
    X, Y = teacher_classification(12, dim=16, n_classes=4, seed=5)
    X, Y = X.to(dev), Y.to(dev)
    loss_fn = nn.CrossEntropyLoss()

    def grads(f):
        stage = mp.stage_module(mp.demo_model(3, n_layers=2 * p, device=dev), r, p)
        snd = mp.Sender()
        f(stage, X if r == 0 else None, Y if r == p - 1 else None, loss_fn, r, p,
          lambda t, dst: snd.send(t, dst), lambda src: mp.recv_tensor(src, device=dev))
        snd.wait_all()
        return np.concatenate([(q.grad if q.grad is not None else torch.zeros_like(q)).detach().cpu()
                               .double().reshape(-1).numpy() for q in stage.parameters()])

    serial = mp.demo_model(3, n_layers=2 * p, device=dev)
    loss_fn(serial(X), Y).backward()
    ref = np.concatenate([q.grad.detach().cpu().double().reshape(-1).numpy()
                          for q in mp.stage_module(serial, r, p).parameters()])
    mistakes = {
        "on a stage before the last, call out.backward(grad_out) with the gradient received from the next "
        "stage; backward from ones computes the gradient of sum(out), not of the loss": grads(_step_variant("ones")),
        "the gradients are the loss's times the number of stages: call backward once per stage, on the "
        "loss (last stage) or with the received gradient unchanged": grads(_step_variant("summed")),
    }
    return diagnose(grads(fn), ref, mistakes, rtol=1e-5, atol=1e-7, what=f"rank {r}'s parameter gradients")
