"""Reference solutions of labs/04_driving.ipynb: the head rank's messages of view parallelism for one micro-batch,
and the same with one typical mistake each (what its checker, :mod:`ddlcourse.exercises.checkers.driving`, must
name)."""
import torch

from ddlcourse.selfcheck import reference


def head_step_solution(head, feats, target, loss_fn, scale, send, recv):
    """One micro-batch on the head rank of a view-parallel model (see the lab's template)."""
    parts = []
    for f in feats:
        if isinstance(f, int):
            parts.append(recv(f).requires_grad_(True))     # a view computed on rank f
        else:
            parts.append(f)                                 # computed here: autograd already links it
    logits = head(torch.cat(parts, dim=1))
    loss = loss_fn(logits, target) / scale
    loss.backward()
    for f, part in zip(feats, parts):
        if isinstance(f, int):
            send(part.grad, f)                              # the view's gradient back to its encoder's rank
    return loss.detach()


def _head_variant(kind: str):
    """The solution with one typical mistake: "no_grad_back", "no_requires_grad", "view_index", "not_scaled"."""
    def head_step(head, feats, target, loss_fn, scale, send, recv):
        parts = []
        for f in feats:
            if isinstance(f, int):
                t = recv(f)
                parts.append(t if kind == "no_requires_grad" else t.requires_grad_(True))
            else:
                parts.append(f)
        logits = head(torch.cat(parts, dim=1))
        loss = loss_fn(logits, target) / (1 if kind == "not_scaled" else scale)
        loss.backward()
        if kind != "no_grad_back":
            for i, (f, part) in enumerate(zip(feats, parts)):
                if isinstance(f, int):
                    send(part.grad, i if kind == "view_index" else f)
        return loss.detach()
    head_step.__name__ = f"head_step_{kind}"
    return head_step


# The fragments are the first 40 characters of the checker's hints (HEAD_HINTS in the checker module).
reference("driving_view_head", mistakes=[
    (_head_variant("no_grad_back"), "the gradients are not sent back: after b"),
    (_head_variant("no_requires_grad"), "a received feature block has no gradient"),
    (_head_variant("view_index"), "wrong neighbour: send each view's gradie"),
    (_head_variant("not_scaled"), "the gradients are `scale` times too larg")])(head_step_solution)
