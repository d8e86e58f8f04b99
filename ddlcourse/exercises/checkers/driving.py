"""Checkers of labs/04_driving.ipynb: its questions, and the checker of its coding exercise, the head rank's
messages of view parallelism (the reference and its typical mistakes are in
:mod:`ddlcourse.exercises.solutions.driving`)."""
import numpy as np
import torch
from torch import nn

from ddlcourse.data.driving import CAR_L, quotas
from ddlcourse.exercises.checkers.model_parallel import P2P
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("driving_ttc", "the gap between bumpers is the centre distance minus one car length; divide by the "
          "closing speed")
def ttc(centre_gap: float, closing_speed: float) -> float:
    return (centre_gap - CAR_L) / closing_speed


@exercise("driving_majority_macro_f1", "the majority class has recall 1 and precision = its share; the other "
          "classes score F1 = 0; macro-F1 averages the three")
def majority_macro_f1(n: int = 23) -> float:
    q = quotas(n)
    p = q[0] / n
    return (2 * p / (p + 1)) / 3


@exercise("driving_bubble", "a pipeline of p stages and m micro-batches idles (p - 1) / (m + p - 1) of the time")
def bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


# --------------------------------------------------------------------------- build it: the head's messages
HEAD_HINTS = {
    "view_index": "wrong neighbour: send each view's gradient to the rank that computed the view (the int in "
                  "feats), not to the view's index",
    "no_requires_grad": "a received feature block has no gradient (None was sent): call requires_grad_(True) on "
                        "it, so that backward computes its gradient",
    "extra_recv": "the head waits for a message that no encoder rank sends: it gets one feature block per view "
                  "it does not own and per micro-batch, and nothing else (on the ranks it would wait for ever)",
    "no_grad_back": "the gradients are not sent back: after backward, send each received view's gradient to the "
                    "rank it came from; that rank waits for it to run its encoder's backward",
    "not_scaled": "the gradients are `scale` times too large: divide the micro-batch's summed loss by `scale` "
                  "(the replica's batch), so the micro-batches add up to the mean",
    "no_loss": "return the micro-batch's loss (a 0-d tensor, detached): the lab adds them up",
}
VIEW_WIDTHS, IN_DIM, N_CLS, ROWS = (5, 7, 6), 4, 3, (4, 6)      # each view its own width: a misrouted block shows


def _view_owners(p: int) -> list[int]:
    """Which rank computes each view; the head is rank p - 1. Owners are not the view indices, so a gradient
    sent to the view's index goes astray."""
    return {2: [0, 0, 1], 3: [1, 0, 2]}.get(p) or [(b + 2) % (p - 1) for b in range(len(VIEW_WIDTHS))]


def _view_model():
    with torch.random.fork_rng():
        torch.manual_seed(321)
        encoders = [nn.Linear(IN_DIM, w) for w in VIEW_WIDTHS]
        head = nn.Sequential(nn.Linear(sum(VIEW_WIDTHS), 8), nn.Tanh(), nn.Linear(8, N_CLS))
    return encoders, head


@code_exercise("driving_view_head", distributed=True, ranks=(2, 3, 4))
def check_view_head(fn, **_) -> Verdict:
    """On every rank: the last rank is the head and runs ``fn(head, feats, target, loss_fn, scale, send, recv)``
    for two micro-batches; the other ranks run the view encoders they own (forwards of both micro-batches sent
    to the head, then the backwards with the gradients they receive), as ``BranchParallel.step`` does. Checked
    by where each gradient goes, the returned losses and every rank's gradients against the serial model."""
    link = P2P()
    r, p = link.rank, link.world
    head_rank, owners = p - 1, _view_owners(p)
    gen = torch.Generator().manual_seed(5)
    xs = [[torch.randn(n, IN_DIM, generator=gen) for _ in VIEW_WIDTHS] for n in ROWS]
    ys = [torch.randint(0, N_CLS, (n,), generator=gen) for n in ROWS]
    scale = float(sum(ROWS))
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    encoders, head = _view_model()
    mine = [b for b, o in enumerate(owners) if o == r]
    losses, problems = [], []

    def branch():          # the package's side of a branch rank (not the learner's)
        feats = {(m, b): encoders[b](xs[m][b]) for m in range(len(ROWS)) for b in mine}
        for (m, b), f in feats.items():
            link.send(f, head_rank)
        for (m, b), f in feats.items():
            g = link.recv(head_rank)
            if tuple(g.shape) != tuple(f.shape):
                problems.append("misrouted")
                raise ValueError(f"rank {r} received a gradient of shape {tuple(g.shape)} for a feature block "
                                 f"of shape {tuple(f.shape)}")
            f.backward(g)

    def on_head():
        for m in range(len(ROWS)):
            feats = [encoders[b](xs[m][b]) if o == r else o for b, o in enumerate(owners)]
            losses.append(fn(head, feats, ys[m], loss_fn, scale, link.send, link.recv))

    err = link.run(on_head if r == head_rank else branch)
    every = link.gather((link.problems + problems, repr(err) if err else None))
    seen = [pr for e in every for pr in e[0]]
    if "misrouted" in seen or "peer" in seen:
        return Verdict(False, HEAD_HINTS["view_index"])
    if "none" in seen:
        return Verdict(False, HEAD_HINTS["no_requires_grad"])
    # an exception comes before what it left undone (the branch ranks then wait for gradients never sent)
    errors = [(s, e[1]) for s, e in enumerate(every) if e[1] and not e[1].startswith("NeverSent")]
    if errors:
        return Verdict(False, f"your function raised on rank {errors[0][0]}: {errors[0][1]}")
    if any(isinstance(pr, tuple) for pr in every[head_rank][0]):       # the head waited for a message never sent
        return Verdict(False, HEAD_HINTS["extra_recv"])
    if any(isinstance(pr, tuple) for pr in seen):                      # an encoder rank waited for its gradient
        return Verdict(False, HEAD_HINTS["no_grad_back"])

    def serial(factor=1.0):
        encs, hd = _view_model()
        total = []
        for m in range(len(ROWS)):
            loss = loss_fn(hd(torch.cat([encs[b](xs[m][b]) for b in range(len(VIEW_WIDTHS))], 1)), ys[m]) / scale
            (loss * factor).backward()
            total.append(loss.item())
        mods = [encs[b] for b in mine] + ([hd] if r == head_rank else [])
        return _grads(mods), total

    ref, ref_losses = serial()
    msg = None
    if r == head_rank and (len(losses) != len(ROWS) or any(not isinstance(v, torch.Tensor) for v in losses)):
        msg = HEAD_HINTS["no_loss"]
    mods = [encoders[b] for b in mine] + ([head] if r == head_rank else [])
    if msg is None:
        v = diagnose(_grads(mods), ref, {HEAD_HINTS["not_scaled"]: serial(scale)[0]},
                     what=f"rank {r}'s parameter gradients")
        msg = None if v.ok else v.message
    if msg is None and r == head_rank and not np.allclose([float(v) for v in losses], ref_losses, rtol=1e-5):
        msg = "the returned losses differ from loss_fn(logits, target) / scale of each micro-batch"
    bad = [(s, m) for s, m in enumerate(link.gather(msg)) if m]
    if not bad:
        return Verdict(True)
    return Verdict(False, bad[0][1] if bad[0][1].startswith(("the ", "return", "wrong", "a ")) else
                   f"rank {bad[0][0]}: {bad[0][1]}")


def _grads(mods) -> np.ndarray:
    return np.concatenate([(q.grad if q.grad is not None else torch.zeros_like(q)).detach().double().reshape(-1)
                           .numpy() for mod in mods for q in mod.parameters()])
