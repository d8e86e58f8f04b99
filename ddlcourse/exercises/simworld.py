"""What a simulated rank shares with its parts (:mod:`~ddlcourse.exercises.simmpi` for ``mpi4py.MPI``,
:mod:`~ddlcourse.exercises.simtorch` for ``torch.distributed``): its line to the referee (:class:`World`, set by
:func:`ddlcourse.exercises.simranks.install`), the MPI buffers as NumPy arrays, and the learner's source lines
(:func:`install_sources`, which a real rank of a check uses too, so that an error names the learner's line).
"""
from __future__ import annotations

import linecache
import pickle
import sys

import numpy as np
import torch

ANY_SOURCE = ANY_TAG = -1
UNDEFINED = -32766


class Aborted(BaseException):
    """The referee ended the rehearsal (a BaseException: the learner's ``except Exception`` does not catch it)."""


# ------------------------------------------------------------------------------------------------- the connection
class World:
    """This rank's line to the referee, and what it knows of the learner's code."""

    def __init__(self, conn, rank: int, n: int, sources: dict):
        self.conn, self.rank, self.n = conn, rank, n
        self.files = set(sources)
        self.learner_calls: list[dict] = []       # this rank's calls from the learner's code (for the checker)

    def send(self, msg) -> None:
        # plain pickle, not the connection's: torch's pickler would share a tensor's memory through a side channel
        self.conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def ask(self, msg):
        self.send(msg)
        reply = pickle.loads(self.conn.recv_bytes())
        if reply[0] == "abort":
            raise Aborted(reply[1])
        return reply[1]

    def post(self, specs: list[dict], wait: str | None = "all"):
        """Post ops; with ``wait``, block until all (or any) are done and return ``{id: result}``, else the ids."""
        learner, line = self.where()
        for s in specs:
            s.setdefault("learner", learner)
            s.setdefault("line", line)
            if s["learner"]:
                self.learner_calls.append({k: s.get(k) for k in ("kind", "name", "peer", "count", "dtype", "shape",
                                                                  "ctx", "tag", "args")})
        return self.ask(("post", specs, wait))

    def wait(self, ids, mode: str = "all") -> dict:
        return self.ask(("wait", list(ids), mode))

    def test(self, ids) -> dict:
        return self.ask(("test", list(ids)))

    def where(self) -> tuple[bool, str]:
        """Whether the learner's code is on the stack, and its innermost line there (``"12: comm.Recv(...)"``)."""
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_filename in self.files:
                text = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
                return True, f"{f.f_lineno}: {text}" if text else str(f.f_lineno)
            f = f.f_back
        return False, ""


WORLD: World | None = None                  # set by simranks.install on a simulated rank


def current() -> World | None:
    """This process's world when it is a simulated rank (a rehearsal), else None."""
    return WORLD


# ------------------------------------------------------------------------------------------------- buffers
def array(buf):
    """The NumPy array behind an MPI buffer argument: an array, ``[buf, MPI.TYPE]``, ``(buf, count, MPI.TYPE)``, or a
    CPU tensor (mpi4py takes those through DLPack). Refuses what mpi4py refuses: a buffer that is not contiguous."""
    if isinstance(buf, (list, tuple)) and buf and not isinstance(buf[0], (int, float)):
        buf = buf[0]
    if torch.is_tensor(buf):
        if not buf.is_contiguous():
            raise BufferError("the tensor is not contiguous: MPI sends contiguous memory (use .contiguous())")
        buf = buf.detach().numpy()
    arr = np.asarray(buf)
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise BufferError("ndarray is not contiguous")
    return arr


def spec(kind, name, ctx, arr=None, **kw) -> dict:
    s = {"kind": kind, "name": name, "ctx": ctx}
    if arr is not None:
        s.update(count=int(arr.size), dtype=str(arr.dtype))
    s.update(kw)
    return s


def into(arr: np.ndarray, values) -> None:
    """Write received ``values`` into the first elements of ``arr`` (in place: ``arr`` is the learner's buffer)."""
    flat = arr.reshape(-1)          # a view: the buffer is contiguous
    v = np.asarray(values).reshape(-1)
    flat[:v.size] = v


def op_name(op) -> str:
    if op is None:
        return "SUM"
    name = getattr(op, "name", None) or str(op).split(".")[-1].strip(">")
    return {"PRODUCT": "PROD"}.get(name, name)


def install_sources(sources: dict) -> None:
    """Let ``linecache`` (and so tracebacks and the calls' ``line``) read the learner's code where it came from a
    notebook cell: ``{filename: {line number: text}}``."""
    for filename, lines in sources.items():
        if not lines:
            continue
        text = [""] * max(int(k) for k in lines)
        for k, v in lines.items():
            text[int(k) - 1] = v if v.endswith("\n") else v + "\n"
        linecache.cache[filename] = (sum(map(len, text)), None, text, filename)
