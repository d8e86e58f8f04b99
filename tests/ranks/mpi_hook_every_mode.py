"""test_mpi_hook: every mode of the DDP communication hook (mpi-overlap, mpi, default) on the world and on a
subgroup, with several buckets, accumulation under no_sync, unused parameters, DDP's buffer broadcast and a
backward that raises; rank 0 prints every rank's measurements (a Python literal)."""
import os, torch
from contextlib import nullcontext
from mpi4py import MPI
from ddlcourse import dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.models.small import MLP, SmallCNN
from ddlcourse.parallel import mpi_hook
from ddlcourse.parallel.data_parallel import wrap, unwrap

info = dist.init()
X, y = teacher_classification(96, dim=8, n_classes=3, seed=1)
IMG = torch.randn(96, 1, 8, 8, generator=torch.Generator().manual_seed(3))   # (batch, channels, H, W)
STEPS, GB = 4, 24                                                            # steps, global batch


class WithUnused(torch.nn.Module):
    # a layer that never takes part: DDP needs find_unused_parameters=True to finish its reduction
    def __init__(self):
        super().__init__()
        self.mlp, self.unused = MLP(8, 3, hidden=32, depth=2), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.mlp(x)


class Boom(torch.autograd.Function):
    # identity; its backward raises while `armed`, after the buckets of the layers above it have been started
    armed = False

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if Boom.armed:
            raise RuntimeError("boom")
        return g


class Breakable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 64), MLP(64, 3, hidden=64, depth=2)

    def forward(self, x):
        return self.b(Boom.apply(torch.relu(self.a(x))))


MODELS = {"mlp": lambda: MLP(8, 3, hidden=64, depth=3), "unused": WithUnused, "cnn": lambda: SmallCNN(1, 3, width=4),
          "boom": Breakable}


def flat(model, what="parameters"):
    return torch.cat([t.detach().double().flatten() for t in getattr(unwrap(model), what)()])


def run(case, world, group, hook, micro=1, boom_at=None, **ddp_kwargs):
    # STEPS steps on the global batch; this rank's share split into `micro` micro-batches (no_sync but the last)
    os.environ[mpi_hook.MODE_VAR] = hook
    r = 0 if world == 1 else torch.distributed.get_rank(group)
    torch.manual_seed(0)
    model = MODELS[case]()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if world > 1:
        model, opt = wrap(model, opt, "ddp", group=group, bucket_cap_mb=0.01, **ddp_kwargs)   # several buckets
    inputs = IMG if case == "cnn" else X
    raised = []
    for step in range(STEPS):
        idx = torch.arange(step * GB, step * GB + GB)[r::world]
        opt.zero_grad()
        Boom.armed = step == boom_at
        try:
            for i, part in enumerate(idx.chunk(micro)):
                sync = world > 1 and i < micro - 1
                with model.no_sync() if sync else nullcontext():
                    loss = torch.nn.functional.cross_entropy(model(inputs[part]), y[part]) / micro
                    loss.backward()
            opt.step()
        except RuntimeError as e:
            raised.append(str(e)[:40])
            if step != boom_at:
                break                       # DDP itself refuses to go on after a backward that raised
    return model, mpi_hook.hook_state(model), raised


def diff(a, b):
    return (a - b).abs().max().item()


out = {}
for k in sorted({2, info.world_size}):
    comm, group = dist.subgroup(k)
    g = None if k == info.world_size else group
    if comm is None:
        dist.barrier()
        continue
    res = {}
    serial = {case: flat(run(case, 1, None, "default")[0]) for case in ("mlp", "unused", "boom")}
    serial["accum"] = serial["mlp"]
    cnn_default, _, _ = run("cnn", k, g, "default")
    for hook in mpi_hook.MODES:
        m, st, _ = run("mlp", k, g, hook)
        ma, st_a, _ = run("mlp", k, g, hook, micro=2)
        mu, st_u, _ = run("unused", k, g, hook, find_unused_parameters=True)
        mc, st_c, _ = run("cnn", k, g, hook)
        res[hook] = dict(
            plain=diff(flat(m), serial["mlp"]), accum=diff(flat(ma), serial["accum"]),
            unused=diff(flat(mu), serial["unused"]),
            cnn_params=diff(flat(mc), flat(cnn_default)),
            cnn_buffers=diff(flat(mc, "buffers"), flat(cnn_default, "buffers")),
            registered=st is not None,
            mode=None if st is None else st.mode,
            buckets=None if st is None else dict(st.buckets),
            accum_buckets=None if st_a is None else dict(st_a.buckets),
            waits=None if st is None else st.waits,
            buffer_syncs=None if st_c is None else dict(st_c.buffer_syncs),
            pending=len(mpi_hook._PENDING.get(mpi_hook._ranks(g), [])))
    # a backward that raises half-way (every rank alike): DDP refuses the next step; a fresh DDP on the same
    # communicator then trains exactly as before, and nothing is left in flight
    for hook in ("mpi-overlap", "mpi"):
        mb, stb, raised = run("boom", k, g, hook, boom_at=2)
        ref, _, _ = run("boom", k, g, hook)
        again, st2, _ = run("boom", k, g, hook)
        res["boom-" + hook] = dict(raised=raised, leftovers=stb.leftovers, ref=diff(flat(ref), serial["boom"]),
                                   again=diff(flat(again), flat(ref)),
                                   pending=len(mpi_hook._PENDING.get(mpi_hook._ranks(g), [])))
    # the buffer hook by itself: four dtypes, one message each (bool and bfloat16 go as bytes), a non-contiguous
    # buffer
    cr = comm.Get_rank()
    bufs = {"f": torch.full((3, 2), float(cr)), "t": torch.full((2, 3), float(cr)).t(),
            "n": torch.tensor(cr), "h": torch.full((4,), cr + 0.5, dtype=torch.bfloat16),
            "b": torch.tensor([cr % 2 == 0, True])}
    st = mpi_hook.MPIHookState(g, mpi_hook.comm_for(g), "mpi")
    mpi_hook.mpi_broadcast_buffers_hook(st, bufs)
    want = {"f": torch.zeros(3, 2), "t": torch.zeros(3, 2), "n": torch.tensor(0),
            "h": torch.full((4,), 0.5, dtype=torch.bfloat16), "b": torch.tensor([True, True])}
    res["bcast"] = dict(equal=all(torch.equal(bufs[n], w) for n, w in want.items()), syncs=dict(st.buffer_syncs))
    out[k] = res
    dist.barrier()
allr = MPI.COMM_WORLD.gather(out, root=0)
mpi_hook.free_comms()
dist.shutdown()
if MPI.COMM_WORLD.rank == 0:
    print(repr(allr))
