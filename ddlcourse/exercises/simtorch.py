"""``torch.distributed`` on a simulated rank: the collectives, point-to-point calls (with ``P2POp`` and
``batch_isend_irecv``), groups, ``Work`` and futures, whose every call goes to the referee through this rank's
:class:`~ddlcourse.exercises.simworld.World`; and a pure-Python ``DistributedDataParallel`` with gradient buckets and
communication hooks, so that a learner's hook or a checker's DDP runs here too (:func:`patch` installs them).
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as tdist

from ddlcourse.exercises import simworld
from ddlcourse.exercises.simworld import ANY_SOURCE, op_name


class TorchGroup:
    """A process group of the simulated world (``group.WORLD`` is ``t0``)."""

    def __init__(self, ctx: str, members):
        self.ctx, self.members = ctx, tuple(members)

    def __repr__(self):
        return f"<simulated group {self.ctx} of ranks {list(self.members)}>"

    def rank(self):
        return self.members.index(simworld.WORLD.rank) if simworld.WORLD.rank in self.members else -1

    def size(self):
        return len(self.members)


class Future:
    """A future as torch's (``wait``, ``value``, ``then``, ``done``), resolved when first asked: the rank then waits
    for the call behind it."""

    def __init__(self, resolve):
        self._resolve, self._done, self._value = resolve, False, None

    def wait(self):
        if not self._done:
            self._value, self._done = self._resolve(), True
        return self._value

    value = wait

    def then(self, callback):
        return Future(lambda: callback(self))

    def done(self):
        return self._done


class Work:
    """The handle of an asynchronous collective or point-to-point call."""

    def __init__(self, rids, finish=None, outputs=None):
        self.rids, self.finish, self.done, self.outputs = list(rids), finish, not rids, outputs

    def wait(self, timeout=None):
        if not self.done:
            got = simworld.WORLD.wait(self.rids)
            self.done = True
            if self.finish is not None:
                self.finish(got)
        return True

    def get_future(self):
        """Its value is the list of the call's output tensors (as gloo's), once the call is done."""
        return Future(lambda: (self.wait(), list(self.outputs or []))[1])

    def is_completed(self):
        if not self.done:
            got = simworld.WORLD.test(self.rids)
            if len(got) == len(self.rids):
                self.done = True
                if self.finish is not None:
                    self.finish(got)
        return self.done

    def is_success(self):
        return self.is_completed()


class P2POp:
    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer


def _group(group) -> TorchGroup:
    return group if isinstance(group, TorchGroup) else GROUP_WORLD


def _tensor_spec(kind, name, group, t, **kw):
    if t.device.type != "cpu":
        raise RuntimeError("the rehearsal runs on the CPU: this tensor is on " + str(t.device))
    return {"kind": kind, "name": name, "ctx": _group(group).ctx, "count": int(t.numel()),
            "dtype": str(t.dtype).replace("torch.", ""), "shape": tuple(t.shape), **kw}


def _put(t, value) -> None:
    with torch.no_grad():
        t.copy_(value.reshape(t.shape) if hasattr(value, "reshape") else value)


def _run(specs, async_op, finish, outputs=None):
    if async_op:
        rids = simworld.WORLD.post(specs, None)
        return Work(rids, finish, outputs)
    got = simworld.WORLD.post(specs, "all")
    if finish is not None:
        finish(got)
    return None


def _first(got: dict):
    return got[sorted(got)[0]]


def all_reduce(tensor, op=None, group=None, async_op=False):
    spec = _tensor_spec("coll", "all_reduce", group, tensor, payload=tensor.detach().clone(), args={"op": op_name(op)})
    return _run([spec], async_op, lambda got: _put(tensor, _first(got)), [tensor])


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    g = _group(group)
    src = g.members[group_src] if group_src is not None else src
    spec = _tensor_spec("coll", "broadcast", g, tensor, payload=tensor.detach().clone() if simworld.WORLD.rank == src else None,
                        args={"src": src})
    return _run([spec], async_op, lambda got: _put(tensor, _first(got)))


def reduce(tensor, dst=None, op=None, group=None, async_op=False, group_dst=None):
    g = _group(group)
    dst = g.members[group_dst] if group_dst is not None else dst
    spec = _tensor_spec("coll", "reduce", g, tensor, payload=tensor.detach().clone(), args={"op": op_name(op), "dst": dst})

    def finish(got):
        res = _first(got)
        if res is not None:
            _put(tensor, res)
    return _run([spec], async_op, finish)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    spec = _tensor_spec("coll", "all_gather", group, tensor, payload=tensor.detach().clone())

    def finish(got):
        for out, part in zip(tensor_list, _first(got)):
            _put(out, part)
    return _run([spec], async_op, finish)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    spec = _tensor_spec("coll", "all_gather_into_tensor", group, input_tensor, payload=input_tensor.detach().clone())
    return _run([spec], async_op, lambda got: _put(output_tensor, torch.cat([p.reshape(-1) for p in _first(got)])))


def reduce_scatter(output, input_list, op=None, group=None, async_op=False):
    spec = _tensor_spec("coll", "reduce_scatter", group, output, payload=[t.detach().clone() for t in input_list],
                        args={"op": op_name(op)})
    return _run([spec], async_op, lambda got: _put(output, _first(got)))


def reduce_scatter_tensor(output, input, op=None, group=None, async_op=False):
    parts = list(input.detach().clone().reshape(_group(group).size(), -1))
    spec = _tensor_spec("coll", "reduce_scatter_tensor", group, input, payload=parts, args={"op": op_name(op)})
    return _run([spec], async_op, lambda got: _put(output, _first(got)))


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    n = _group(group).size()
    sizes = list(input_split_sizes) if input_split_sizes is not None else [input.shape[0] // n] * n
    parts = list(torch.split(input.detach().clone(), sizes, dim=0))
    want = list(output_split_sizes) if output_split_sizes is not None else [output.shape[0] // n] * n
    spec = _tensor_spec("coll", "all_to_all_single", group, input, payload=parts, args={"recv_sizes": want})
    return _run([spec], async_op, lambda got: _put(output, torch.cat(_first(got), dim=0)))


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    spec = _tensor_spec("coll", "all_to_all", group, input_tensor_list[0],
                        payload=[t.detach().clone() for t in input_tensor_list])

    def finish(got):
        for out, part in zip(output_tensor_list, _first(got)):
            _put(out, part)
    return _run([spec], async_op, finish)


def barrier(group=None, async_op=False, device_ids=None):
    return _run([{"kind": "coll", "name": "barrier", "ctx": _group(group).ctx}], async_op, None)


def _p2p_spec(kind, name, tensor, peer, group, tag):
    g = _group(group)
    if peer is None or peer not in g.members:
        raise ValueError(f"{name}: rank {peer} is not a rank of this group {list(g.members)}")
    spec = _tensor_spec(kind, name, g, tensor, peer=peer, tag=tag)
    if kind == "send":
        spec["payload"] = tensor.detach().clone()
    return spec


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    g = _group(group)
    dst = g.members[group_dst] if group_dst is not None else dst
    simworld.WORLD.post([_p2p_spec("send", "send", tensor, dst, g, tag)], "all")


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    g = _group(group)
    src = g.members[group_src] if group_src is not None else src
    spec = _p2p_spec("recv", "recv", tensor, src, g, tag) if src is not None else \
        _tensor_spec("recv", "recv", g, tensor, peer=ANY_SOURCE, tag=tag)
    res = _first(simworld.WORLD.post([spec], "all"))
    _put(tensor, res["payload"])
    return res["source"]


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    g = _group(group)
    dst = g.members[group_dst] if group_dst is not None else dst
    return Work(simworld.WORLD.post([_p2p_spec("send", "isend", tensor, dst, g, tag)], None))


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    g = _group(group)
    src = g.members[group_src] if group_src is not None else src
    rids = simworld.WORLD.post([_p2p_spec("recv", "irecv", tensor, src, g, tag)], None)
    return Work(rids, lambda got: _put(tensor, _first(got)["payload"]))


def batch_isend_irecv(p2p_op_list):
    specs, finishes = [], []
    for p in p2p_op_list:
        peer = _group(p.group).members[p.group_peer] if p.group_peer is not None else p.peer
        if p.op is isend:
            specs.append(_p2p_spec("send", "isend", p.tensor, peer, p.group, p.tag))
            finishes.append(None)
        elif p.op is irecv:
            specs.append(_p2p_spec("recv", "irecv", p.tensor, peer, p.group, p.tag))
            finishes.append(p.tensor)
        else:
            raise ValueError("P2POp's op must be torch.distributed.isend or torch.distributed.irecv")
    rids = simworld.WORLD.post(specs, None)
    works = []
    for rid, t in zip(rids, finishes):
        works.append(Work([rid], None if t is None else (lambda got, t=t: _put(t, _first(got)["payload"]))))
    return works


def all_gather_object(object_list, obj, group=None):
    got = _first(simworld.WORLD.post([{"kind": "coll", "name": "all_gather_object", "ctx": _group(group).ctx,
                              "dtype": "object", "payload": pickle.dumps(obj)}], "all"))
    object_list[:] = got


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None):
    ranks = tuple(range(simworld.WORLD.n)) if ranks is None else tuple(sorted(int(r) for r in ranks))
    made = _first(simworld.WORLD.post([{"kind": "coll", "name": "new_group", "ctx": "t0", "args": {"ranks": ranks}}], "all"))
    return TorchGroup(made["ctx"], ranks) if simworld.WORLD.rank in ranks else tdist.GroupMember.NON_GROUP_MEMBER


def get_rank(group=None):
    return _group(group).rank()


def get_world_size(group=None):
    return _group(group).size()


def get_process_group_ranks(group):
    return list(_group(group).members)


def get_global_rank(group, group_rank):
    return _group(group).members[group_rank]


def get_group_rank(group, global_rank):
    return _group(group).members.index(global_rank)


class GradBucket:
    """What a DDP communication hook is handed: a bucket's gradients, flat in one buffer."""

    def __init__(self, index: int, params: list, last: bool):
        self._index, self._params, self._last = index, params, last
        self._buffer = torch.cat([p.grad.detach().reshape(-1) for p in params])

    def buffer(self):
        return self._buffer

    def set_buffer(self, t):
        self._buffer = t

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return list(self._params)

    def gradients(self):
        return [p.grad for p in self._params]


class DistributedDataParallel(torch.nn.Module):
    """DDP as a simulated rank has it, in Python: rank 0's parameters broadcast at the start, gradient buckets of
    at most ``bucket_cap_mb`` in the reverse order of the parameters, each handed to the communication hook (default:
    the mean over the group by an allreduce) as soon as its gradients are all there, the results waited for and
    copied back when the last bucket is in; ``no_sync()`` lets gradients accumulate."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False, gradient_as_bucket_view=False,
                 **kwargs):
        super().__init__()
        self.module, self.process_group = module, process_group
        g = _group(process_group)
        self._params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                broadcast(t.data, src=g.members[0], group=g)
        cap = (25 if bucket_cap_mb is None else bucket_cap_mb) * 2 ** 20
        self._buckets, bucket, size = [], [], 0
        for p in reversed(self._params):
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self._buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self._buckets.append(bucket)
        self._of = {id(p): i for i, b in enumerate(self._buckets) for p in b}
        self._hook, self._state, self._sync = None, None, True
        self._ready, self._futures = [0] * len(self._buckets), {}
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        self._ready, self._futures = [0] * len(self._buckets), {}
        return self.module(*args, **kwargs)

    def register_comm_hook(self, state, hook):
        self._state, self._hook = state, hook

    def no_sync(self):
        ddp = self

        class _NoSync:
            def __enter__(self):
                self.old, ddp._sync = ddp._sync, False

            def __exit__(self, *exc):
                ddp._sync = self.old
        return _NoSync()

    def _grad_ready(self, p):
        if not self._sync:
            return
        i = self._of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self._buckets[i]):
            bucket = GradBucket(i, self._buckets[i], i == len(self._buckets) - 1)
            hook = self._hook or (lambda state, b: _mean_hook(self.process_group, b))
            self._futures[i] = (bucket, hook(self._state, bucket))
            if len(self._futures) == len(self._buckets):
                self._finish()

    def _finish(self):
        for i in sorted(self._futures):
            bucket, fut = self._futures[i]
            flat = fut.wait() if hasattr(fut, "wait") else fut
            flat = flat[0] if isinstance(flat, (list, tuple)) else flat
            offset = 0
            with torch.no_grad():
                for p in bucket.parameters():
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
        self._futures = {}


def _mean_hook(process_group, bucket):
    buf = bucket.buffer()
    buf.div_(_group(process_group).size())
    return all_reduce(buf, group=process_group, async_op=True).get_future().then(lambda f: f.value()[0])


GROUP_WORLD: TorchGroup | None = None


def patch(world: simworld.World) -> None:
    global GROUP_WORLD
    GROUP_WORLD = TorchGroup("t0", range(world.n))
    calls = dict(all_reduce=all_reduce, broadcast=broadcast, reduce=reduce, all_gather=all_gather,
                 all_gather_into_tensor=all_gather_into_tensor, reduce_scatter=reduce_scatter,
                 reduce_scatter_tensor=reduce_scatter_tensor, all_to_all_single=all_to_all_single,
                 all_to_all=all_to_all, barrier=barrier, send=send, recv=recv, isend=isend, irecv=irecv,
                 batch_isend_irecv=batch_isend_irecv, P2POp=P2POp, all_gather_object=all_gather_object,
                 new_group=new_group, get_rank=get_rank, get_world_size=get_world_size,
                 get_process_group_ranks=get_process_group_ranks, get_global_rank=get_global_rank,
                 get_group_rank=get_group_rank, is_initialized=lambda: True, is_available=lambda: True,
                 get_backend=lambda group=None: "gloo", destroy_process_group=lambda group=None: None)
    for name, fn in calls.items():
        setattr(tdist, name, fn)
    tdist.group.WORLD = GROUP_WORLD
    torch.nn.parallel.DistributedDataParallel = DistributedDataParallel
    torch.cuda.is_available = lambda: False         # a rehearsal computes on the CPU
