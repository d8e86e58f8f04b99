"""Planted communication mistakes for every distributed build-it exercise: the reference answer with, first, a
deadlock, an exception on one rank, or a message that does not fit its receive, made with the means of
communication the exercise gives the learner (its ``comm``, its ``send``/``recv``, its ``allreduce``, or
``torch.distributed``; ``mpi4py``'s world where it gives none).

They are what ``tests/test_wrong_submissions.py`` submits to each checker, one after the other on one cluster,
and what ``python -m ddlcourse bench-checkers`` times: each must be named (:data:`NAMED`) within seconds, and the
reference must pass right after, on the same engines.

* ``deadlock``: every rank receives first, from the rank before it, a message no rank sends (where the learner
  has only a collective, rank 0 calls it once more than the others, at the end);
* ``raises``: the last rank raises before it communicates, while the others go on and wait for it;
* ``mismatch``: each rank sends the rank after it a message that does not fit the receive: one element more per
  rank (``comm``), another dtype (``torch.distributed``, ``send``), or a collective whose size differs between
  the ranks (``allreduce``).
"""
from __future__ import annotations

import functools
import inspect

from ddlcourse import selfcheck
from ddlcourse.parallel import param_server     # the parameter server's tags, GRAD and PARAM

KINDS = ("deadlock", "raises", "mismatch")
TAG = 4242                      # the planted messages' tag: none of the exercises uses it

# what a verdict on each planted mistake must say (any of the phrases, in lower case)
NAMED = {
    "deadlock": ("deadlock", "wait for each other", "waited for each other", "waits for a message",
                 "never sent", "wait for it for ever", "wait for ever for the others", "waits for ever"),
    "raises": ("planted on rank",),
    "mismatch": ("does not fit", "truncated", "different sizes", "dtype", "float64"),
}


# where an exercise's protocol differs from the defaults: the tags its receives and sends use, the rank whose
# learner code raises (ssp_server's code runs on rank 0, the server, alone), whether the planted receive comes
# after the exercise's own calls (driving's head: the encoder ranks send first, so a first receive finds a message)
PROTOCOL = {"ssp_server": {"recv_tag": "GRAD", "send_tag": "PARAM", "raise_on": 0},
            "driving_view_head": {"deadlock_after": True}}


class PlantedError(RuntimeError):
    """The exception the ``raises`` mistake raises on one rank."""


def _rank_world() -> tuple[int, int]:
    import torch.distributed as tdist
    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank(), tdist.get_world_size()
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _tag(protocol: dict, which: str) -> int:
    name = protocol.get(which)
    return getattr(param_server, name) if name else TAG


def _plant(kind: str, args: dict, protocol: dict) -> tuple[dict, object]:
    """Make the mistake ``kind`` with what ``args`` (the exercise's arguments by name) gives; returns the
    arguments to call the reference with (a wrapped ``send`` for ``mismatch``) and what to do after it (a
    function of no arguments, or None)."""
    import numpy as np
    import torch

    if kind == "raises":
        r, n = _rank_world()                                         # the real rank (a checker's comm may be fake)
        if r == protocol.get("raise_on", n - 1):
            raise PlantedError(f"planted on rank {r}: this rank fails before it sends anything")
        return args, None
    if "comm" in args:                                               # mpi4py, the exercise's communicator
        comm = args["comm"]
        r, n = comm.Get_rank(), comm.Get_size()
        nxt, prev = (r + 1) % n, (r - 1) % n
        if kind == "deadlock":
            comm.Recv(np.empty(4, dtype=np.float64), source=prev, tag=_tag(protocol, "recv_tag"))
        elif hasattr(comm, "Isend"):
            req = comm.Isend(np.zeros(4 + r, dtype=np.float32), dest=nxt, tag=_tag(protocol, "send_tag"))
            comm.Recv(np.empty(4, dtype=np.float32), source=prev, tag=_tag(protocol, "recv_tag"))
            req.Wait()
        else:                                                        # a checker's stand-in with blocking calls only
            comm.Send(np.zeros(4 + r, dtype=np.float32), dest=nxt, tag=_tag(protocol, "send_tag"))
        return args, None
    r, n = _rank_world()
    nxt, prev = (r + 1) % n, (r - 1) % n
    if "send" in args and "recv" in args:                            # the checker's send(t, dst) and recv(src)
        if kind == "deadlock":
            recv = args["recv"]
            if len(inspect.signature(recv).parameters) >= 2:            # recv(buf, src), as torch's
                wait = lambda: recv(torch.empty(1), prev)               # noqa: E731
            else:
                wait = lambda: recv(prev)                               # noqa: E731
            if protocol.get("deadlock_after"):
                return args, wait
            wait()
            return args, None
        send = args["send"]
        return dict(args, send=lambda t, dst: send(t.double() if t.is_floating_point() else t, dst)), None
    if "allreduce" in args:                                          # the checker's allreduce(tensor)
        if kind == "deadlock":                                       # the others never call it
            return args, (lambda: args["allreduce"](torch.zeros(3))) if r == 0 else None
        args["allreduce"](torch.zeros(2 + r))
        return args, None
    import torch.distributed as tdist
    if tdist.is_available() and tdist.is_initialized():              # torch.distributed
        if kind == "deadlock":
            tdist.recv(torch.empty(2), src=prev, tag=TAG)
        else:
            work = tdist.isend(torch.zeros(4, dtype=torch.float64 if r % 2 == 0 else torch.float32), nxt, tag=TAG)
            tdist.recv(torch.empty(4, dtype=torch.float32), src=prev, tag=TAG)
            work.wait()
        return args, None
    from mpi4py import MPI  # lazy: see _rank_world
    _plant(kind, dict(args, comm=MPI.COMM_WORLD), protocol)          # no means of its own: the MPI world's
    return args, None


def planted(name: str, kind: str):
    """The reference answer of distributed coding exercise ``name`` with the mistake ``kind`` (one of
    :data:`KINDS`) made before it communicates. A function for a function; for a class (``my_ddp``'s module,
    ``syncbn_function``'s autograd function), a subclass that makes it when it is built, or in ``forward``."""
    import torch

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    ref = selfcheck._code_exercise(name).solution
    if ref is None:
        raise ValueError(f"{name} has no registered reference")
    protocol = PROTOCOL.get(name, {})

    if isinstance(ref, type) and issubclass(ref, torch.autograd.Function):
        sig = inspect.signature(ref.forward)

        class PlantedFunction(ref):
            @staticmethod
            def forward(ctx, *args):
                bound = sig.bind(ctx, *args).arguments
                new, after = _plant(kind, dict(bound), protocol)
                out = ref.forward(*[new[k] for k in bound])
                if after is not None:
                    after()
                return out
        PlantedFunction.__name__ = f"{ref.__name__}_{kind}"
        return PlantedFunction
    if isinstance(ref, type):
        sig = inspect.signature(ref.__init__)

        class Planted(ref):
            def __init__(self, *args, **kwargs):
                bound = sig.bind(self, *args, **kwargs)
                new, after = _plant(kind, dict(bound.arguments), protocol)
                bound.arguments.update(new)
                super().__init__(*bound.args[1:], **bound.kwargs)
                if after is not None:
                    after()
        Planted.__name__ = f"{ref.__name__}_{kind}"
        return Planted

    sig = inspect.signature(ref)

    @functools.wraps(ref)
    def wrong(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        new, after = _plant(kind, dict(bound.arguments), protocol)
        bound.arguments.update(new)
        out = ref(*bound.args, **bound.kwargs)
        if after is not None:
            after()
        return out
    wrong.__name__ = f"{ref.__name__}_{kind}"
    del wrong.__wrapped__                 # cloudpickle sends the wrapper as it is, not the reference it wraps
    return wrong


def distributed_exercises() -> list[str]:
    """The names of the distributed coding exercises that have a reference, sorted."""
    selfcheck._load_all()
    return sorted(n for n, ex in selfcheck.CODE_EXERCISES.items()
                  if ex.distributed and ex.solution is not None and not n.startswith("_"))


def named(kind: str, message: str) -> bool:
    """Whether ``message`` says what the planted mistake ``kind`` did."""
    low = message.lower()
    return any(p in low for p in NAMED[kind])
