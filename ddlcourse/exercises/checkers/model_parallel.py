"""Checkers of notebooks/15_model_parallel.ipynb: its questions, and the checker of one model-parallel training
step on one rank (the reference and its typical mistakes are in :mod:`ddlcourse.exercises.solutions.model_parallel`).

The coding exercise ("build it"): one model-parallel training step on one rank, with ``send(t, dst)`` and
``recv(buf, src)`` that work like ``torch.distributed.send``/``recv``: the receiver must allocate a buffer of the
right shape, so the shape travels first. The checker runs it on the ranks of the cluster over :class:`P2P`, a
point-to-point layer on MPI that cannot hang: a rank that finishes tells the others, so a receive that waits for
a message its sender never sends ends with an error instead of a deadlock (the notebooks 16 and lab 4 use it too).
"""
from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from ddlcourse.exercises import rehearsal
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise, raised


@exercise("naive_idle_fraction", "one stage works at a time: each rank works 1/p of the time")
def naive_idle_fraction(num_stages: int) -> float:
    return (num_stages - 1) / num_stages


@exercise("model_parallel_messages", "p-1 boundaries, one activation forward and one gradient backward across each")
def model_parallel_messages(num_stages: int) -> int:
    return 2 * (num_stages - 1)


# --------------------------------------------------------------------------- point-to-point for the checkers
_TAG = 77
_LIMBO: list = []        # send requests that no rank will match (a learner's extra sends): kept, never waited on


class NeverSent(RuntimeError):
    """A receive from a rank that finished without sending the message."""


class P2P:
    """Point-to-point messages between the ranks of a checker, over a private duplicate of ``MPI.COMM_WORLD``.

    ``send(t, dst)`` never blocks. A receive waits for the next message from ``src``; when ``src`` has finished
    (its learner function returned or raised) without sending it, the receive raises :class:`NeverSent` at
    once, so a missing send ends the check instead of hanging it. A cycle of receives (two ranks waiting for
    each other) ends after ``timeout`` seconds. Everything sent and received is logged in ``self.log``.
    """

    def __init__(self, timeout: float = 20.0, dtype=torch.float32):
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
        self.comm = MPI.COMM_WORLD.Dup()          # collective: every rank creates its checker's P2P together
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout, self.log, self.problems = timeout, [], []
        self.dtype = dtype                        # the stages compute in it: a float tensor sent in another is wrong
        self.not_written = False

    # the learner's primitives ------------------------------------------------------------------------------
    def send(self, t, dst) -> None:
        if t is None:
            self.problems.append("none")
            raise TypeError(f"rank {self.rank} sent None to rank {dst}")
        dst = int(dst)
        if not 0 <= dst < self.world or dst == self.rank:
            self.problems.append("peer")
            raise ValueError(f"rank {self.rank} sent to rank {dst}, which is not another rank of {self.world}")
        if t.is_floating_point() and t.dtype != self.dtype:
            self.problems.append("dtype")
            raise TypeError(f"rank {self.rank} sent a {t.dtype} tensor to rank {dst}; the stages compute in "
                            f"{self.dtype}: send activations and gradients as they are (no .double(), no trip "
                            "through numpy)")
        arr = t.detach().cpu().numpy().copy()
        self.log.append(("send", dst, tuple(arr.shape)))
        _LIMBO.append(self.comm.isend(("data", arr), dest=dst, tag=_TAG))

    def recv(self, src) -> torch.Tensor:
        """The next tensor from ``src`` (any shape: this layer carries it)."""
        arr = self._next(int(src))
        self.log.append(("recv", int(src), tuple(arr.shape)))
        return torch.from_numpy(arr)

    def recv_into(self, buf, src) -> None:
        """Like ``torch.distributed.recv(buf, src)``: fills ``buf``, which must have the shape that was sent."""
        src = int(src)
        arr = self._next(src)
        self.log.append(("recv", src, tuple(arr.shape)))
        if tuple(buf.shape) != tuple(arr.shape):
            self.problems.append("shape")
            raise ValueError(f"rank {self.rank} received a tensor of shape {tuple(arr.shape)} from rank {src} "
                             f"into a buffer of shape {tuple(buf.shape)}")
        with torch.no_grad():
            buf.copy_(torch.from_numpy(arr))

    # the checker's side ------------------------------------------------------------------------------------
    def _next(self, src: int) -> np.ndarray:
        if not 0 <= src < self.world or src == self.rank:
            self.problems.append("peer")
            raise ValueError(f"rank {self.rank} received from rank {src}, which is not another rank of {self.world}")
        if rehearsal.calls() is not None:     # a rehearsal: wait in a real receive, so the referee sees a cycle at once
            self.comm.Probe(source=src, tag=_TAG)
        deadline = time.monotonic() + self.timeout
        while not self.comm.Iprobe(source=src, tag=_TAG):
            if time.monotonic() > deadline:
                self.problems.append("timeout")
                raise TimeoutError(f"rank {self.rank} waited {self.timeout:.0f} s for rank {src}")
            time.sleep(0.0005)
        kind, arr = self.comm.recv(source=src, tag=_TAG)
        if kind == "fin":
            self.problems.append(("never", src))
            raise NeverSent(f"rank {self.rank} waits for a message that rank {src} never sent")
        return arr

    def run(self, fn, *args):
        """``fn(*args)`` on this rank; then tell every other rank that this one is done. Returns the exception
        that ``fn`` raised, or None (a ``NotImplementedError`` too: :meth:`gather` raises it on every rank)."""
        err = None
        try:
            fn(*args)
        except Exception as e:       # noqa: BLE001  (the learner's error, reported by the checker)
            err = e
            if not isinstance(e, (NotImplementedError, NeverSent)):
                raised(e)
            self.not_written = self.not_written or isinstance(e, NotImplementedError)
        finally:
            for r in range(self.world):
                if r != self.rank:
                    _LIMBO.append(self.comm.isend(("fin", None), dest=r, tag=_TAG))
        return err

    def gather(self, obj) -> list:
        """``obj`` of every rank. Where the learner's function is not written yet on some rank (only one rank
        may run it), every rank raises ``NotImplementedError``, after the collective, so none is left waiting."""
        every = self.comm.allgather((self.not_written, obj))
        if any(nw for nw, _ in every):
            raise NotImplementedError
        return [o for _, o in every]


# --------------------------------------------------------------------------- build it: one step across the stages
WIDTHS = (16, 23, 19, 29, 13, 31, 17, 27, 21, 25, 14, 33, 18, 26, 22, 30, 15)   # each boundary its own width
BATCH, N_CLASSES = 10, 5


HINTS = {
    "wrong_neighbour": "wrong neighbour: activations go to rank + 1 and come from rank - 1; gradients go back to "
                       "rank - 1 and come from rank + 1",
    "no_requires_grad": "inp.grad is None: call requires_grad_(True) on the received activation, so that "
                        "backward computes its gradient",
    "guessed_shape": "the shape was not communicated: the receiver cannot know it (it changes from stage to "
                     "stage and with the batch); send the shape first as a small int64 tensor, then the data",
    "no_grad_back": "the gradient is not sent back: after backward, every stage but the first sends its input's "
                    "gradient (inp.grad) to rank - 1, which waits for it",
    "ones": "on a stage before the last, call out.backward(grad_out) with the gradient received from the next "
            "stage; backward from ones computes the gradient of sum(out), not of the loss",
    "summed": "the gradients are the loss's times the number of stages: call backward once per stage, on the "
              "loss (last stage) or with the received gradient unchanged",
}


def _stages(p: int) -> list[nn.Sequential]:
    """The checker's model, cut into ``p`` stages (the same on every rank): stage s maps WIDTHS[s] features to
    WIDTHS[s + 1] (the last stage to the classes)."""
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        dims = list(WIDTHS[:p]) + [N_CLASSES]
        return [nn.Sequential(nn.Linear(dims[s], dims[s + 1]), nn.Tanh()) if s < p - 1
                else nn.Sequential(nn.Linear(dims[s], dims[s + 1])) for s in range(p)]


def _flat_grads(module) -> np.ndarray:
    return np.concatenate([(q.grad if q.grad is not None else torch.zeros_like(q)).detach().double()
                           .reshape(-1).numpy() for q in module.parameters()])


def _stage_step_diagnosis(run, sends_per_rank, errors, r, p) -> str | None:
    """The first typical mistake that the ranks' problems, send logs and exceptions (``repr`` or None, one per
    rank) show, or None. An exception on one rank comes before what it left undone: its neighbours then wait for
    messages it never sent."""
    problems = [pr for rank_probs in run for pr in rank_probs]
    for s, sends in enumerate(sends_per_rank):         # a float tensor to the wrong side
        for _, dst, shape in sends:
            if len(shape) == 2 and ((shape[1] == WIDTHS[s] and s > 0 and dst != s - 1)
                                    or (s < p - 1 and shape[1] == WIDTHS[s + 1] and dst != s + 1)):
                return HINTS["wrong_neighbour"]
    if "peer" in problems:
        return HINTS["wrong_neighbour"]
    if "none" in problems:
        return HINTS["no_requires_grad"]
    if "shape" in problems:
        return HINTS["guessed_shape"]
    if "timeout" in problems:
        return ("two ranks wait for each other's message: a stage sends its output before it waits for the "
                "gradient, and receives its input before it runs")
    raised = [(s, e) for s, e in enumerate(errors) if e and not e.startswith("NeverSent")]
    if raised:
        return f"your function raised on rank {raised[0][0]}: {raised[0][1]}"
    for s in range(1, p):
        if not any(dst == s - 1 and len(shape) == 2 for _, dst, shape in sends_per_rank[s]):
            return HINTS["no_grad_back"]
    return None


@code_exercise("stage_send_recv", distributed=True, ranks=(2, 3))
def check_stage_send_recv(fn, **_) -> Verdict:
    """On every rank (rank r runs stage r): ``fn(stage, x, y, loss_fn, rank, world, send, recv)`` does one forward
    and backward across the stages; ``send(t, dst)`` sends a tensor, ``recv(buf, src)`` fills ``buf`` (which must
    have the shape sent). Checked by the messages (to whom, which shapes) and by the gradients of this rank's
    parameters against the serial model."""
    link = P2P()
    r, p = link.rank, link.world
    gen = torch.Generator().manual_seed(99)
    X = torch.randn(BATCH, WIDTHS[0], generator=gen)
    Y = torch.randint(0, N_CLASSES, (BATCH,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    stage = _stages(p)[r]
    err = link.run(fn, stage, X if r == 0 else None, Y if r == p - 1 else None, loss_fn, r, p,
                   link.send, link.recv_into)
    every = link.gather((link.problems, [e for e in link.log if e[0] == "send"], repr(err) if err else None))
    hint = _stage_step_diagnosis([e[0] for e in every], [e[1] for e in every], [e[2] for e in every], r, p)
    if hint:
        return Verdict(False, hint)

    def serial_grads(scale_last=1.0, ones=False):
        stages = _stages(p)
        h = X
        for s in stages[:r + 1]:
            h = s(h)
        if ones and r < p - 1:
            h.backward(torch.ones_like(h))
        else:
            loss = loss_fn(nn.Sequential(*stages[r + 1:])(h) if r < p - 1 else h, Y)
            (loss * scale_last).backward()
        return _flat_grads(stages[r])

    verdict = diagnose(_flat_grads(stage), serial_grads(),
                       {HINTS["ones"]: serial_grads(ones=True), HINTS["summed"]: serial_grads(scale_last=p)},
                       what=f"rank {r}'s parameter gradients")
    if verdict.ok:                                    # right only where every rank is right
        bad = [(s, v) for s, v in enumerate(link.gather((verdict.ok, verdict.message))) if not v[0]]
        return Verdict(True) if not bad else Verdict(False, f"rank {bad[0][0]}: {bad[0][1][1]}")
    link.gather((verdict.ok, verdict.message))
    return verdict
