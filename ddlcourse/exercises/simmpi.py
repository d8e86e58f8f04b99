"""The module that stands for ``mpi4py.MPI`` on a simulated rank: communicators, requests, statuses and groups
whose every call goes to the referee through this rank's :class:`~ddlcourse.exercises.simworld.World`, with the
buffers read as NumPy arrays as mpi4py reads them (:func:`module` builds it; :func:`ddlcourse.exercises.simranks.install`
puts it in the place of ``mpi4py.MPI``).
"""
from __future__ import annotations

import pickle
import time
import types

import numpy as np

from ddlcourse.exercises import simworld
from ddlcourse.exercises.simworld import ANY_SOURCE, ANY_TAG, UNDEFINED, array, into, op_name, spec


class _Op:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<MPI.{self.name}>"


class _Datatype:
    def __init__(self, name):
        self.name = name


class Status:
    def __init__(self):
        self.source, self.tag, self.error, self.count = ANY_SOURCE, ANY_TAG, 0, 0

    def Get_source(self):
        return self.source

    def Get_tag(self):
        return self.tag

    def Get_count(self, datatype=None):
        return self.count

    Get_elements = Get_count

    def Get_error(self):
        return self.error

    def _fill(self, res):
        if res:
            self.source, self.tag, self.count = res.get("source", ANY_SOURCE), res.get("tag", ANY_TAG), res.get("count", 0)


class Request:
    """A non-blocking call; ``finish(result)`` puts what arrived where the learner asked."""

    def __init__(self, comm, rid, finish=None, value=None):
        self.comm, self.rid, self.finish, self.value, self.done = comm, rid, finish, value, rid is None

    def _complete(self, res, status=None):
        if not self.done:
            self.done = True
            if self.finish is not None:
                self.value = self.finish(res)
        if status is not None:
            status._fill(res)

    def Wait(self, status=None):
        if not self.done:
            self._complete(simworld.WORLD.wait([self.rid])[self.rid], status)
        return None

    def wait(self, status=None):
        self.Wait(status)
        return self.value

    def Test(self, status=None):
        if not self.done:
            got = simworld.WORLD.test([self.rid])
            if self.rid in got:
                self._complete(got[self.rid], status)
        return self.done

    def test(self, status=None):
        return self.Test(status), self.value

    def Cancel(self):
        pass

    def Free(self):
        pass

    @staticmethod
    def Waitall(requests, statuses=None):
        live = [r for r in requests if not r.done]
        if live:
            got = simworld.WORLD.wait([r.rid for r in live])
            for r in live:
                r._complete(got[r.rid])
        return True

    @staticmethod
    def waitall(requests, statuses=None):
        Request.Waitall(requests)
        return [r.value for r in requests]

    @staticmethod
    def Waitany(requests, status=None):
        live = [r for r in requests if not r.done]
        if not live:
            return UNDEFINED
        got = simworld.WORLD.wait([r.rid for r in live], mode="any")
        for i, r in enumerate(requests):
            if not r.done and r.rid in got:
                r._complete(got[r.rid], status)
                return i
        return UNDEFINED

    @staticmethod
    def Testall(requests, statuses=None):
        return all(r.Test() for r in requests)

    @staticmethod
    def Testany(requests, status=None):
        for i, r in enumerate(requests):
            if r.Test(status):
                return True, i
        return False, UNDEFINED


class Group:
    def __init__(self, members):
        self.members = tuple(members)

    def Incl(self, ranks):
        return Group([self.members[r] for r in ranks])

    def Get_size(self):
        return len(self.members)

    def Get_rank(self):
        return self.members.index(simworld.WORLD.rank) if simworld.WORLD.rank in self.members else UNDEFINED

    def Free(self):
        pass


class Comm:
    """A communicator of the simulated world: the same methods as mpi4py's, through the referee."""

    def __init__(self, ctx: str, members):
        self.ctx, self.members = ctx, tuple(members)
        self.rank, self.size = self.members.index(simworld.WORLD.rank), len(self.members)

    def __eq__(self, other):
        return isinstance(other, Comm) and other.ctx == self.ctx

    def __hash__(self):
        return hash(self.ctx)

    def __repr__(self):
        return f"<simulated communicator {self.ctx} of ranks {list(self.members)}>"

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def _world(self, r):
        if r in (ANY_SOURCE, None):
            return ANY_SOURCE
        if not 0 <= r < self.size:
            raise ValueError(f"rank {r} is not a rank of this communicator (size {self.size}): MPI_ERR_RANK")
        return self.members[r]

    def _local(self, world_rank):
        return self.members.index(world_rank) if world_rank in self.members else world_rank

    # -- point to point, buffers
    def _send(self, name, buf, dest, tag, wait):
        arr = array(buf)
        op = spec("send", name, self.ctx, arr, peer=self._world(dest), tag=tag, payload=arr.copy())
        return simworld.WORLD.post([op], wait)

    def _recv_spec(self, name, buf, source, tag):
        arr = array(buf)
        return arr, spec("recv", name, self.ctx, arr, peer=self._world(source), tag=tag)

    def _finish_recv(self, arr, status=None):
        def finish(res):
            into(arr, res["payload"])
            if status is not None:
                status._fill({**res, "source": self._local(res["source"])})
        return finish

    def Send(self, buf, dest, tag=0):
        self._send("Send", buf, dest, tag, "all")

    Ssend = Rsend = Bsend = Send

    def Isend(self, buf, dest, tag=0):
        rid = self._send("Isend", buf, dest, tag, None)[0]
        return Request(self, rid)

    Issend = Irsend = Ibsend = Isend

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        arr, spec = self._recv_spec("Recv", buf, source, tag)
        res = next(iter(simworld.WORLD.post([spec], "all").values()))
        self._finish_recv(arr, status)(res)

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        arr, spec = self._recv_spec("Irecv", buf, source, tag)
        rid = simworld.WORLD.post([spec], None)[0]
        return Request(self, rid, self._finish_recv(arr))

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        out = array(sendbuf)
        arr, rspec = self._recv_spec("Sendrecv", recvbuf, source, recvtag)
        sspec = spec("send", "Sendrecv", self.ctx, out, peer=self._world(dest), tag=sendtag, payload=out.copy())
        got = simworld.WORLD.post([sspec, rspec], "all")
        ids = sorted(got)
        self._finish_recv(arr, status)(got[ids[1]])

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        self.Sendrecv(array(buf).copy(), dest, sendtag, buf, source, recvtag, status)

    # -- point to point, pickled objects (count: the elements of an array or tensor sent, for the checkers)
    def _obj_send(self, name, obj, dest, tag):
        return spec("send", name, self.ctx, peer=self._world(dest), tag=tag, dtype="object",
                    count=int(getattr(obj, "size", 0)) if isinstance(obj, np.ndarray) else 0,
                    payload=pickle.dumps(obj))

    def _obj_recv(self, name, source, tag):
        return spec("recv", name, self.ctx, peer=self._world(source), tag=tag, dtype="object")

    def send(self, obj, dest, tag=0):
        simworld.WORLD.post([self._obj_send("send", obj, dest, tag)], "all")

    def isend(self, obj, dest, tag=0):
        rid = simworld.WORLD.post([self._obj_send("isend", obj, dest, tag)], None)[0]
        return Request(self, rid)

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        res = next(iter(simworld.WORLD.post([self._obj_recv("recv", source, tag)], "all").values()))
        if status is not None:
            status._fill({**res, "source": self._local(res["source"])})
        return pickle.loads(res["payload"])

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        rid = simworld.WORLD.post([self._obj_recv("irecv", source, tag)], None)[0]
        return Request(self, rid, lambda res: pickle.loads(res["payload"]))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        got = simworld.WORLD.post([self._obj_send("sendrecv", sendobj, dest, sendtag),
                                   self._obj_recv("sendrecv", source, recvtag)], "all")
        return pickle.loads(got[sorted(got)[1]]["payload"])

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        res = next(iter(simworld.WORLD.post([spec("probe", "Probe", self.ctx, peer=self._world(source), tag=tag)],
                                   "all").values()))
        if status is not None:
            status._fill({**res, "source": self._local(res["source"])})
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        rid = simworld.WORLD.post([spec("probe", "Iprobe", self.ctx, peer=self._world(source), tag=tag)], None)[0]
        got = simworld.WORLD.test([rid])
        if rid in got and status is not None:
            status._fill({**got[rid], "source": self._local(got[rid]["source"])})
        simworld.WORLD.ask(("cancel", rid))
        return rid in got

    # -- collectives, buffers
    def _coll(self, name, arr=None, wait="all", **kw):
        got = simworld.WORLD.post([spec("coll", name, self.ctx, arr, **kw)], wait)
        return got if wait is None else next(iter(got.values()))

    def Allreduce(self, sendbuf, recvbuf, op=None):
        recv = array(recvbuf)
        send = recv if sendbuf is IN_PLACE else array(sendbuf)
        into(recv, self._coll("Allreduce", send, payload=send.copy(), args={"op": op_name(op)}))

    def Iallreduce(self, sendbuf, recvbuf, op=None):
        recv = array(recvbuf)
        send = recv if sendbuf is IN_PLACE else array(sendbuf)
        rid = self._coll("Iallreduce", send, wait=None, payload=send.copy(), args={"op": op_name(op)})[0]
        return Request(self, rid, lambda res: into(recv, res))

    def Reduce(self, sendbuf, recvbuf, op=None, root=0):
        recv = array(recvbuf) if recvbuf is not None else None
        send = recv if sendbuf is IN_PLACE else array(sendbuf)
        res = self._coll("Reduce", send, payload=send.copy(), args={"op": op_name(op), "root": root})
        if res is not None and recv is not None:
            into(recv, res)

    def Bcast(self, buf, root=0):
        arr = array(buf)
        into(arr, self._coll("Bcast", arr, payload=arr.copy() if self.rank == root else None, args={"root": root}))

    def Allgather(self, sendbuf, recvbuf):
        recv = array(recvbuf)
        send = array(sendbuf)
        parts = self._coll("Allgather", send, payload=send.copy())
        into(recv, np.concatenate([np.asarray(p).reshape(-1) for p in parts]))

    def Gather(self, sendbuf, recvbuf, root=0):
        send = array(sendbuf)
        parts = self._coll("Gather", send, payload=send.copy(), args={"root": root})
        if parts is not None and recvbuf is not None:
            into(array(recvbuf), np.concatenate([np.asarray(p).reshape(-1) for p in parts]))

    def Scatter(self, sendbuf, recvbuf, root=0):
        recv = array(recvbuf)
        parts = None
        if self.rank == root:
            parts = np.array_split(array(sendbuf).reshape(-1), self.size)
        into(recv, self._coll("Scatter", recv, payload=parts, args={"root": root}))

    def Alltoall(self, sendbuf, recvbuf):
        send, recv = array(sendbuf), array(recvbuf)
        parts = self._coll("Alltoall", send, payload=np.array_split(send.reshape(-1), self.size))
        into(recv, np.concatenate([np.asarray(p).reshape(-1) for p in parts]))

    def Barrier(self):
        self._coll("Barrier")

    barrier = Barrier

    def Ibarrier(self):
        rid = self._coll("Ibarrier", wait=None)[0]
        return Request(self, rid)

    # -- collectives, pickled objects
    def _obj(self, name, obj, **args):
        return self._coll(name, dtype="object", payload=pickle.dumps(obj), args=args)

    def allreduce(self, sendobj, op=None):
        return self._obj("allreduce", sendobj, op=op_name(op))

    def allgather(self, sendobj):
        return self._obj("allgather", sendobj)

    def bcast(self, obj, root=0):
        return self._obj("bcast", obj if self.rank == root else None, root=root)

    def gather(self, sendobj, root=0):
        return self._obj("gather", sendobj, root=root)

    def scatter(self, sendobj, root=0):
        return self._obj("scatter", sendobj if self.rank == root else None, root=root)

    def reduce(self, sendobj, op=None, root=0):
        return self._obj("reduce", sendobj, op=op_name(op), root=root)

    def alltoall(self, sendobj):
        return self._obj("alltoall", sendobj)

    # -- communicators
    def Split(self, color=0, key=0):
        made = self._coll("Split", args={"color": None if color == UNDEFINED else color, "key": key})
        return COMM_NULL if made is None else Comm(made["ctx"], made["members"])

    def Split_type(self, split_type, key=0, info=None):
        return self.Split(0, key)              # every simulated rank shares one host

    def Dup(self):
        made = self._coll("Dup")
        return Comm(made["ctx"], made["members"])

    Clone = Dup

    def Get_group(self):
        return Group(self.members)

    def Create_group(self, group, tag=0):
        members = group.members
        if simworld.WORLD.rank not in members:
            return COMM_NULL
        made = self._coll("Create_group", args={"members": members, "tag": tag})
        return Comm(made["ctx"], made["members"])

    def Free(self):
        pass

    def Abort(self, errorcode=0):
        raise RuntimeError(f"MPI_Abort({errorcode}) called on rank {simworld.WORLD.rank}")


class _NullComm:
    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return 0

    def __bool__(self):
        return False

    def Free(self):
        pass


COMM_NULL = _NullComm()
IN_PLACE = object()



def module(world: simworld.World) -> types.ModuleType:
    """The module that stands for ``mpi4py.MPI`` on a simulated rank."""
    m = types.ModuleType("mpi4py.MPI")
    m.__file__ = __file__
    for name in ("SUM", "MAX", "MIN", "PROD", "LAND", "LOR", "BAND", "BOR", "MAXLOC", "MINLOC"):
        setattr(m, name, _Op(name))
    for name in ("BYTE", "CHAR", "INT", "LONG", "FLOAT", "DOUBLE", "BOOL", "INT64_T", "INT32_T", "FLOAT32_T"):
        setattr(m, name, _Datatype(name))
    m.COMM_WORLD = Comm("m0", range(world.n))
    m.COMM_SELF = m.COMM_WORLD if world.n == 1 else None
    m.COMM_NULL, m.IN_PLACE, m.ANY_SOURCE, m.ANY_TAG, m.UNDEFINED = COMM_NULL, IN_PLACE, ANY_SOURCE, ANY_TAG, UNDEFINED
    m.PROC_NULL = -2
    m.REQUEST_NULL = Request(None, None)
    m.Status, m.Request, m.Comm, m.Intracomm, m.Group = Status, Request, Comm, Comm, Group
    m.THREAD_SINGLE, m.THREAD_FUNNELED, m.THREAD_SERIALIZED, m.THREAD_MULTIPLE = 0, 1, 2, 3
    m.COMM_TYPE_SHARED = 0
    m.Is_initialized = lambda: True
    m.Is_finalized = lambda: False
    m.Query_thread = lambda: 3
    m.Wtime = time.perf_counter
    m.Get_processor_name = lambda: "simulated"
    m.Get_library_version = lambda: "the course's rehearsal (simulated ranks)"
    return m
