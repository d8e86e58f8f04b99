"""The referee of a rehearsal: every MPI and ``torch.distributed`` call of the simulated ranks comes here, and it
matches them the way MPI and a process group would, strictly.

* A send completes only when its receive is posted (rendezvous, what MPI does for large messages), so an order
  that works only while messages are small deadlocks here at once, at any size.
* Collectives on a communicator or group match in the order each rank calls them; the ranks must agree on the
  call, the sizes, the dtypes, the reduction and the root.
* When every rank that has not finished waits and nothing can move, that is a deadlock, found the moment it
  happens: no timeout to wait for.
* A message whose size or dtype does not fit its receive, and ranks that disagree in a collective, are reported
  as what they are, naming the ranks, the sizes and the dtypes; nothing runs on after it.

The referee keeps every call as an :class:`Op` (the trace: what each rank did, in order), which the report and
the timeline figure of :mod:`ddlcourse.exercises.rehearsal` read. It is plain Python with no MPI: the ranks talk to
it through :mod:`ddlcourse.exercises.simranks`.
"""
from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field

import numpy as np

ANY = -1                                        # ANY_SOURCE / ANY_TAG
P2P = {"send", "recv"}


class Problem(Exception):
    """What stopped a rehearsal: ``kind`` (deadlock, mismatch, truncated, collective, died, raised, timeout), a
    message, and the ops it concerns (the first mismatch is marked in the timeline)."""

    def __init__(self, kind: str, message: str, ops=()):
        super().__init__(message)
        self.kind, self.message, self.ops = kind, message, list(ops)


@dataclass
class Op:
    """One call of one rank: a send, a receive, or one rank's part of a collective."""

    rank: int                    # world rank of the caller
    seq: int                     # its position among the rank's calls
    kind: str                    # send | recv | coll
    name: str                    # the call as the rank made it: Send, Irecv, Allreduce, all_reduce, isend, ...
    ctx: str                     # communicator or group: m0 (COMM_WORLD), t0 (torch's world), m3, t2, ...
    peer: int = ANY              # world rank of the other side (sends and receives), ANY_SOURCE on a receive
    tag: int = 0
    count: int = 0               # elements (a receive: its capacity)
    dtype: str = ""              # numpy's or torch's name; "object" for a pickled message
    shape: tuple = ()
    args: dict = field(default_factory=dict)     # a collective's own: op, root, splits, ...
    payload: object = None       # what travels: an array, a tensor, a pickled object (dropped once delivered)
    learner: bool = False        # made inside the learner's code
    line: str = ""               # the learner's line that made it
    t_post: float = 0.0
    t_done: float | None = None
    result: object = None        # what the rank gets back when the op completes
    match: tuple | None = None   # (rank, seq) of the other side of a message

    @property
    def done(self) -> bool:
        return self.t_done is not None

    def describe(self) -> str:
        """``Recv from rank 2 (tag 0): 4 float64`` and the like."""
        what = f"{self.count} {self.dtype}" if self.dtype and self.dtype != "object" else "an object"
        if self.shape and self.dtype != "object":
            what = f"a {self.dtype} tensor of shape {tuple(self.shape)}"
        if self.kind == "send":
            return f"{self.name} to rank {self.peer} (tag {self.tag}): {what}"
        if self.kind == "probe":
            src = "any rank" if self.peer == ANY else f"rank {self.peer}"
            return f"{self.name} for a message from {src} (tag {self.tag if self.tag != ANY else 'any'})"
        if self.kind == "recv":
            src = "any rank" if self.peer == ANY else f"rank {self.peer}"
            into = f"into {what}" if self.dtype != "object" else what
            return f"{self.name} from {src} (tag {self.tag if self.tag != ANY else 'any'}) {into}"
        extra = "".join(f", {k} {v}" for k, v in self.args.items() if k in ("op", "root", "src", "dst"))
        return f"{self.name} on {_ctx_name(self.ctx)}: {what}{extra}"


def _ctx_name(ctx: str) -> str:
    return {"m0": "COMM_WORLD", "t0": "the default group"}.get(ctx, ("communicator " if ctx[0] == "m" else "group ")
                                                                 + ctx)


@dataclass
class Context:
    """A communicator (``m...``) or a torch group (``t...``): its members, in their order (rank i is members[i])."""

    name: str
    members: tuple


class Referee:
    """Matches the calls of ``n`` simulated ranks; see the module docstring."""

    def __init__(self, n: int):
        self.n = n
        self.t0 = time.perf_counter()
        self.ops: list[Op] = []                          # every call, in the order they reached the referee
        self.by_rank: list[list[Op]] = [[] for _ in range(n)]
        self.ctx = {"m0": Context("m0", tuple(range(n))), "t0": Context("t0", tuple(range(n)))}
        self._sends: dict = {}                           # (ctx, dst) -> posted sends not yet received
        self._recvs: dict = {}                           # (ctx, dst) -> posted receives not yet matched
        self._probes: dict = {}                          # (ctx, dst) -> probes waiting for a message
        self._coll: dict = {}                            # (ctx, k) -> {rank: Op}
        self._ncoll: dict = {}                           # (ctx, rank) -> collectives called so far
        self._made: dict = {}                            # (parent ctx, k, key) -> new ctx name
        self._counter = {"m": 0, "t": 0}

    # ------------------------------------------------------------------------------------------ posting
    def post(self, rank: int, spec: dict) -> Op:
        """Record one call and match it with what is there; returns its op (done or not)."""
        op = Op(rank=rank, seq=len(self.by_rank[rank]), t_post=self.now(), **spec)
        if op.ctx not in self.ctx:
            raise Problem("died", f"rank {rank} used a communicator the referee does not know ({op.ctx})", [op])
        self.ops.append(op)
        self.by_rank[rank].append(op)
        if op.kind == "send":
            self._post_send(op)
        elif op.kind == "recv":
            self._post_recv(op)
        elif op.kind == "probe":
            self._post_probe(op)
        else:
            self._post_coll(op)
        return op

    def _post_probe(self, op: Op) -> None:
        """A probe sees a message that is there (the oldest that matches) without taking it."""
        for sd in self._sends.get((op.ctx, op.rank), []):
            if op.peer in (ANY, sd.rank) and op.tag in (ANY, sd.tag):
                op.result, op.t_done = {"source": sd.rank, "tag": sd.tag, "count": sd.count}, self.now()
                return
        self._probes.setdefault((op.ctx, op.rank), []).append(op)

    def cancel(self, op: Op) -> None:
        """An Iprobe that found nothing: it is forgotten, not waited for."""
        if not op.done:
            queue = self._probes.get((op.ctx, op.rank), [])
            if op in queue:
                queue.remove(op)
            op.t_done, op.result = self.now(), None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _members(self, ctx: str) -> tuple:
        return self.ctx[ctx].members

    def _post_send(self, op: Op) -> None:
        probes = self._probes.get((op.ctx, op.peer), [])
        for pr in [p for p in probes if p.peer in (ANY, op.rank) and p.tag in (ANY, op.tag)]:
            probes.remove(pr)
            pr.result, pr.t_done = {"source": op.rank, "tag": op.tag, "count": op.count}, self.now()
        queue = self._recvs.setdefault((op.ctx, op.peer), [])
        for i, rv in enumerate(queue):
            if rv.peer in (ANY, op.rank) and rv.tag in (ANY, op.tag):
                queue.pop(i)
                self._deliver(op, rv)
                return
        self._sends.setdefault((op.ctx, op.peer), []).append(op)

    def _post_recv(self, op: Op) -> None:
        queue = self._sends.setdefault((op.ctx, op.rank), [])
        for i, sd in enumerate(queue):            # in the order they were sent: messages do not overtake
            if op.peer in (ANY, sd.rank) and op.tag in (ANY, sd.tag):
                queue.pop(i)
                self._deliver(sd, op)
                return
        self._recvs.setdefault((op.ctx, op.rank), []).append(op)

    def _deliver(self, sd: Op, rv: Op) -> None:
        sd.match, rv.match = (rv.rank, rv.seq), (sd.rank, sd.seq)
        _check_message(sd, rv)
        now = self.now()
        rv.result = {"payload": sd.payload, "source": sd.rank, "tag": sd.tag, "count": sd.count}
        sd.result = None
        sd.payload = None
        sd.t_done = rv.t_done = now

    # ------------------------------------------------------------------------------------------ collectives
    def _post_coll(self, op: Op) -> None:
        members = self._members(op.ctx)
        if op.rank not in members:
            raise Problem("collective", f"rank {op.rank} called {op.name} on {_ctx_name(op.ctx)}, which it is not "
                                        f"part of (its ranks are {list(members)})", [op])
        if op.name == "Create_group":             # collective over the new group's members only
            members = tuple(op.args["members"])
            key = ("cg", op.ctx, members, op.args.get("tag", 0))
        else:
            key = op.ctx
        k = self._ncoll.get((key, op.rank), 0)
        self._ncoll[(key, op.rank)] = k + 1
        arrived = self._coll.setdefault((key, k), {})
        arrived[op.rank] = op
        if len(arrived) == len(members):
            ops = [arrived[r] for r in members]
            del self._coll[(key, k)]
            self._resolve(ops, key, k)

    def _resolve(self, ops: list[Op], key, k: int) -> None:
        first = ops[0]
        names = {_NONBLOCKING.get(o.name, o.name) for o in ops}
        if len(names) > 1:
            calls = "; ".join(f"rank {o.rank} called {o.name}" for o in ops)
            raise Problem("collective", f"the ranks of {_ctx_name(first.ctx)} called different collectives at "
                                        f"the same point ({calls}): every rank must call the same collectives, "
                                        f"in the same order{_apart(ops, k)}", ops)
        name = names.pop()
        for field_ in ("op", "root", "src", "dst"):
            vals = {o.args.get(field_) for o in ops}
            if len(vals) > 1:
                said = "; ".join(f"rank {o.rank}: {o.args.get(field_)}" for o in ops)
                raise Problem("collective", f"the ranks disagree on the {field_} of {name} ({said})", ops)
        if name in _SAME_SIZE:
            sig = {(o.count, o.dtype, tuple(o.shape)) for o in ops if o.dtype}
            if len(sig) > 1:
                said = "; ".join(f"rank {o.rank}: " + (f"a {o.dtype} tensor of shape {tuple(o.shape)}" if o.shape
                                                       else f"{o.count} {o.dtype}") for o in ops)
                raise Problem("collective", f"{name} on {_ctx_name(first.ctx)} with different sizes or dtypes "
                                            f"({said}): every rank must give the same{_apart(ops, k)}", ops)
        resolve = _objects if first.dtype == "object" and name != "barrier" else _COLLECTIVES.get(name)
        if resolve is None:
            raise Problem("collective", f"{name} is not a call the rehearsal knows", ops)
        results = resolve(self, ops, key, k)
        now = self.now()
        for o, res in zip(ops, results):
            o.result, o.payload, o.t_done = res, None, now

    def new_context(self, kind: str, members) -> str:
        self._counter[kind] += 1
        name = f"{kind}{self._counter[kind]}"
        self.ctx[name] = Context(name, tuple(members))
        return name

    # ------------------------------------------------------------------------------------------ the end
    def pending(self, rank: int) -> list[Op]:
        return [o for o in self.by_rank[rank] if not o.done]

    def deadlock(self, waiting: dict, finished: dict) -> Problem:
        """The problem when every rank that has not finished waits for an op (``waiting``: rank -> its ops)."""
        lines, blocked = [], []
        for r in sorted(waiting):
            for o in waiting[r]:
                if not o.done:
                    blocked.append(o)
                    where = f"   at your line {o.line}" if o.line else "" if o.learner else "   (the checker's call)"
                    lines.append(f"  rank {r} waits in {o.describe()}{where}")
        for r in sorted(finished):
            lines.append(f"  rank {r} has {finished[r]}")
        return Problem("deadlock", "\n".join(lines), blocked)


_NONBLOCKING = {"Iallreduce": "Allreduce", "Ibcast": "Bcast", "Ibarrier": "Barrier", "Iallgather": "Allgather",
                "Ireduce": "Reduce", "Ialltoall": "Alltoall"}
_SAME_SIZE = {"Allreduce", "allreduce", "Reduce", "all_reduce", "reduce", "Bcast", "broadcast", "Allgather",
              "all_gather", "all_gather_into_tensor", "Alltoall", "reduce_scatter_tensor"}


def _apart(ops: list[Op], k: int) -> str:
    """Where each rank made its part of a collective that does not agree, when the ranks are at different calls:
    a collective that one rank makes and the others do not meets the others' next one (in MPI, it waits for
    ever or mixes two calls)."""
    places = {(o.learner, o.line) for o in ops}
    if len(places) < 2:
        return ""
    where = "; ".join(f"rank {o.rank} " + (f"at your line {o.line}" if o.learner and o.line else
                                           "in your code" if o.learner else "back in the checker, after your code")
                      for o in ops)
    return (f". The ranks are at different calls, their collective number {k + 1} there ({where}): one rank "
            "makes a collective the others do not make, or makes them in another order, and on a real cluster "
            "it would wait for ever for the others or meet their next call")


def _check_message(sd: Op, rv: Op) -> None:
    """A message must fit its receive: same dtype, no more elements than the buffer holds (torch: same shape)."""
    if sd.dtype == "object" or rv.dtype == "object":
        if (sd.dtype == "object") != (rv.dtype == "object"):
            raise Problem("mismatch", f"rank {sd.rank} sends with {sd.name} and rank {rv.rank} receives with "
                                      f"{rv.name}: the pickling calls (send/recv, lower case) and the buffer calls "
                                      "(Send/Recv) do not match each other", [sd, rv])
        return
    same = sd.line and sd.line == rv.line
    at = lambda o: f" (your line {o.line})" if o.line and not same else ""   # noqa: E731
    tail = f" Both at your line {sd.line}." if same else ""
    if sd.shape and rv.shape is not None and sd.name.islower():           # torch: the tensor as it is
        if tuple(sd.shape) != tuple(rv.shape) or sd.dtype != rv.dtype:
            raise Problem("mismatch", f"rank {sd.rank} sends a {sd.dtype} tensor of shape {tuple(sd.shape)} to "
                                      f"rank {rv.rank}{at(sd)}, which receives it into a {rv.dtype} tensor of shape "
                                      f"{tuple(rv.shape)}{at(rv)}: a receive needs a tensor of the shape and dtype "
                                      f"of what is sent.{tail}", [sd, rv])
        return
    if sd.dtype != rv.dtype and sd.count:          # an empty message fits any receive (MPI compares no elements)
        raise Problem("mismatch", f"rank {sd.rank} sends {sd.count} {sd.dtype} ({sd.count * _size(sd.dtype)} bytes) "
                                  f"to rank {rv.rank}{at(sd)}, which receives into a {rv.dtype} buffer of {rv.count} "
                                  f"({rv.count * _size(rv.dtype)} bytes){at(rv)}: the receive buffer needs the "
                                  f"sender's dtype (np.empty(k, dtype=buf.dtype)).{tail}", [sd, rv])
    if sd.count > rv.count:
        raise Problem("truncated", f"message truncated: rank {sd.rank} sends {sd.count} {sd.dtype} to rank "
                                   f"{rv.rank}{at(sd)}, whose receive buffer holds {rv.count}{at(rv)}.{tail}",
                      [sd, rv])


def _size(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return {"bfloat16": 2}.get(dtype, 0)


# ---------------------------------------------------------------------------------------------- collectives
def _reduce(values, op: str):
    """Reduce arrays or tensors (one per rank) elementwise with ``op``."""
    out = values[0].copy() if isinstance(values[0], np.ndarray) else values[0].clone()
    for v in values[1:]:
        if op in ("SUM", "AVG", "sum"):
            out = out + v
        elif op in ("MAX", "max"):
            out = np.maximum(out, v) if isinstance(out, np.ndarray) else out.maximum(v)
        elif op in ("MIN", "min"):
            out = np.minimum(out, v) if isinstance(out, np.ndarray) else out.minimum(v)
        elif op in ("PROD", "PRODUCT"):
            out = out * v
        else:
            raise Problem("collective", f"the reduction {op} is not one the rehearsal knows")
    if op == "AVG":
        out = out / len(values) if not hasattr(out, "is_floating_point") or out.is_floating_point() \
            else out // len(values)
    return out


def _allreduce(ref, ops, key, k):
    v = _reduce([o.payload for o in ops], ops[0].args.get("op", "SUM"))
    return [v] * len(ops)


def _reduce_root(ref, ops, key, k):
    """To one rank: MPI's Reduce (``root``, a rank of the communicator) or torch's reduce (``dst``, a world rank)."""
    v = _reduce([o.payload for o in ops], ops[0].args.get("op", "SUM"))
    members = ref._members(ops[0].ctx)
    root = members.index(ops[0].args["dst"]) if "dst" in ops[0].args else ops[0].args.get("root", 0)
    return [v if i == root else None for i in range(len(ops))]


def _bcast(ref, ops, key, k):
    root = ops[0].args.get("root", 0)
    if "src" in ops[0].args:                                     # torch: a world rank
        root = ref._members(ops[0].ctx).index(ops[0].args["src"])
    return [ops[root].payload] * len(ops)


def _allgather(ref, ops, key, k):
    parts = [o.payload for o in ops]
    return [parts] * len(ops)


def _gather(ref, ops, key, k):
    root = ops[0].args.get("root", 0)
    parts = [o.payload for o in ops]
    return [parts if i == root else None for i in range(len(ops))]


def _scatter(ref, ops, key, k):
    root = ops[0].args.get("root", 0)
    parts = ops[root].payload
    if parts is None or len(parts) != len(ops):
        raise Problem("collective", f"scatter from rank {ops[root].rank} needs one item per rank ({len(ops)})", ops)
    return list(parts)


def _alltoall(ref, ops, key, k):
    """Each rank's payload is a list of parts, part j for member j; rank i gets part i of every member."""
    n = len(ops)
    for o in ops:
        if len(o.payload) != n:
            raise Problem("collective", f"rank {o.rank} gives {len(o.payload)} parts to {o.name} on {n} ranks", ops)
    for i, o in enumerate(ops):
        want = o.args.get("recv_sizes")
        if want is not None:
            got = [int(ops[j].payload[i].shape[0]) for j in range(n)]
            if list(want) != got:
                raise Problem("mismatch", f"{o.name}: rank {o.rank} expects {list(want)} rows from the ranks, they "
                                          f"send it {got}: the output split sizes must be what each rank sends",
                              ops)
    return [[ops[j].payload[i] for j in range(n)] for i in range(n)]


def _reduce_scatter(ref, ops, key, k):
    """Each rank gives a list of parts (part j for member j); rank i gets the reduction of the parts i."""
    n = len(ops)
    op = ops[0].args.get("op", "SUM")
    return [_reduce([ops[j].payload[i] for j in range(n)], op) for i in range(n)]


def _barrier(ref, ops, key, k):
    return [None] * len(ops)


def _made(ref, kind: str, members) -> dict:
    """A new communicator or group, as its ranks learn of it: its name and its members."""
    return {"ctx": ref.new_context(kind, members), "members": tuple(members)}


def _split(ref, ops, key, k):
    """MPI's Split: ranks of the same colour form a communicator, ordered by key, then by their old rank."""
    colours = {}
    for i, o in enumerate(ops):
        c = o.args["color"]
        if c is not None and c >= 0:
            colours.setdefault(c, []).append((o.args["key"], i, o.rank))
    made = {c: _made(ref, "m", [r for _, _, r in sorted(v)]) for c, v in sorted(colours.items())}
    return [made.get(o.args["color"]) if o.args["color"] is not None and o.args["color"] >= 0 else None for o in ops]


def _dup(ref, ops, key, k):
    return [_made(ref, ops[0].ctx[0], ref._members(ops[0].ctx))] * len(ops)


def _create_group(ref, ops, key, k):
    return [_made(ref, "m", ops[0].args["members"])] * len(ops)


def _new_group(ref, ops, key, k):
    """torch's new_group: collective over the whole world; every rank passes the same ranks."""
    wanted = {tuple(o.args["ranks"]) for o in ops}
    if len(wanted) > 1:
        said = "; ".join(f"rank {o.rank}: {list(o.args['ranks'])}" for o in ops)
        raise Problem("collective", f"new_group called with different ranks ({said}): every rank of the world calls "
                                    "it, with the same ranks, in the same order", ops)
    return [_made(ref, "t", wanted.pop())] * len(ops)


def _objects(ref, ops, key, k):
    """Pickled objects: all_gather_object and the lower-case MPI calls (allgather, allreduce, bcast, ...)."""
    name = ops[0].name
    parts = [pickle.loads(o.payload) if isinstance(o.payload, bytes) else o.payload for o in ops]
    if name in ("allgather", "all_gather_object"):
        return [parts] * len(ops)
    if name == "allreduce":
        op = ops[0].args.get("op", "SUM")
        acc = parts[0]
        for p in parts[1:]:
            acc = {"SUM": lambda a, b: a + b, "MAX": max, "MIN": min, "PROD": lambda a, b: a * b}[op](acc, p)
        return [acc] * len(ops)
    if name == "bcast":
        return [parts[ops[0].args.get("root", 0)]] * len(ops)
    if name == "gather":
        root = ops[0].args.get("root", 0)
        return [parts if i == root else None for i in range(len(ops))]
    if name == "scatter":
        root = ops[0].args.get("root", 0)
        return list(parts[root])
    if name == "reduce":
        root = ops[0].args.get("root", 0)
        res = _objects(ref, [Op(**{**o.__dict__, "name": "allreduce"}) for o in ops], key, k)[0]
        return [res if i == root else None for i in range(len(ops))]
    if name == "alltoall":
        return [[parts[j][i] for j in range(len(ops))] for i in range(len(ops))]
    raise Problem("collective", f"{name} is not a call the rehearsal knows")


_COLLECTIVES = {
    "Allreduce": _allreduce, "all_reduce": _allreduce, "Reduce": _reduce_root, "reduce": _reduce_root,
    "Bcast": _bcast, "broadcast": _bcast, "Allgather": _allgather, "all_gather": _allgather,
    "all_gather_into_tensor": _allgather, "Gather": _gather, "Scatter": _scatter, "Alltoall": _alltoall,
    "all_to_all_single": _alltoall, "all_to_all": _alltoall, "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter, "Barrier": _barrier, "barrier": _barrier, "Split": _split,
    "Split_type": _split, "Dup": _dup, "Create_group": _create_group, "new_group": _new_group,
    "allgather": _objects, "all_gather_object": _objects, "allreduce": _objects, "bcast": _objects,
    "gather": _objects, "scatter": _objects, "alltoall": _objects,
}
