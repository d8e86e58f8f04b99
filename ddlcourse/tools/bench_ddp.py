"""DDP with each communication-hook mode and Horovod, timed side by side on CPU ranks.

Run it on 2 ranks (any N >= 2 works)::

    mpiexec -n 2 -bind-to none -genv OMP_NUM_THREADS 1 python -m ddlcourse bench-ddp [--model cnn|mlp|both] [--reps N] [--lab1]

For each model -- ``cnn``, the synthetic-benchmark CNN as notebooks 08 and 13 time it
(``synthetic_bench.run("smallcnn", batch_size=32, image_size=32, width=16)``), and ``mlp``, a 1.2 M-parameter
MLP -- one run prints, with the ways **interleaved** (every repetition times each way once, in turn, so a load
spike on a shared machine hits them alike):

* seconds per training step of the same model and per-rank batch: 1 rank alone (no communication), DDP in each
  mode of :mod:`ddlcourse.parallel.mpi_hook` (``default``: DDP's own hook, gloo; ``mpi``: a blocking MPI
  allreduce per bucket; ``mpi-overlap``: MPI allreduces started per bucket and waited for at the end of
  backward), and Horovod (MPI), each the slowest rank's time, median and min-max over the repetitions;
* throughput (samples/s over all ranks) and weak-scaling efficiency ``t(1 rank) / t(N ranks)`` of each way;
* DDP against Horovod, as a ratio taken within each repetition (median and min-max): for the CNN the throughput
  ratio (above 1: DDP is faster), for the MLP the step-time ratio (above 1: DDP is slower);

then, once, the bus bandwidth of the hand-written ring allreduce and of ``MPI_Allreduce`` at 16 MiB and the
latency of a 64-float allreduce through gloo and through MPI; with ``--lab1``, lab 1's (maize) segmentation
step on 1 and 2 ranks at the ``laptop`` scale in each hook mode, and the 2-rank strong-scaling speedup.

Nothing here is asserted: it measures, and the figures depend on the machine and on its load. Compare ways within
one run, never against a number from another run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

from ddlcourse import dist, runtimes, synthetic_bench
from ddlcourse.cases import maize
from ddlcourse.device import synchronize
from ddlcourse.models.small import MLP
from ddlcourse.parallel import mpi_hook
from ddlcourse.parallel.mpi_hook import register_mpi_hook

MODELS = ("cnn", "mlp")
BATCH = {"cnn": 32, "mlp": 64}       # samples per rank per step: the CNN's is synthetic_bench's default
# On CPU ranks: DDP in each hook mode ($DDLCOURSE_DDP_HOOK), Horovod reducing through MPI.
HOOK_WAYS = {"DDP default (gloo)": "default", "DDP mpi": "mpi", "DDP mpi-overlap": "mpi-overlap"}
WAYS = ("1 rank", *HOOK_WAYS, "Horovod")
# On GPUs DDP's buckets go through NCCL (the MPI hooks decline CUDA buckets), and so do Horovod's when it was
# built with HOROVOD_GPU_OPERATIONS=NCCL (env/build_horovod_gpu.sh): the GPU table names what it measured.
GPU_WAYS = ("1 rank", "DDP (NCCL)", "Horovod")


def ways_for(device) -> tuple[str, ...]:
    return GPU_WAYS if getattr(device, "type", "cpu") == "cuda" else WAYS


def _quiet_barrier(comm) -> None:
    """A barrier that sleeps while it waits (MPICH's Barrier spins, which would steal the core of a rank that
    is timing a 1-rank baseline)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(2e-4)


def build(model: str, device) -> tuple[nn.Module, torch.Generator, tuple]:
    """The model (seeded: the same on every rank), a generator for this rank's batch, and one sample's shape."""

    torch.manual_seed(0)
    if model == "mlp":                               # about 1.2 M parameters
        net = MLP(256, 10, hidden=512, depth=5)
        shape = (256,)
    elif model == "cnn":                             # synthetic_bench.run("smallcnn", image_size=32, width=16)
        net = synthetic_bench.build_model("smallcnn", 32, width=16)
        shape = (3, 32, 32)
    else:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    g = torch.Generator().manual_seed(dist.seed_for_rank(5, dist.rank()))
    return net.to(device), g, shape


def make_ways(model: str, batch: int, device):
    """``{way: step function}``; every way trains its own copy of the same initial model."""
    import horovod.torch as hvd


    ways = {}
    for way in ways_for(device):
        net, g, shape = build(model, device)
        x = torch.randn(batch, *shape, generator=g).to(device)        # (batch, *shape)
        t = torch.randint(0, 10, (batch,), generator=g).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        if way.startswith("DDP"):
            net = nn.parallel.DistributedDataParallel(
                net, device_ids=[device.index] if device.type == "cuda" else None)
            hook = HOOK_WAYS.get(way, "default")
            if hook != "default" and not register_mpi_hook(net, hook_mode=hook):
                raise RuntimeError("the MPI hook could not be registered (see ddlcourse.grid.mpi_usable())")
        elif way == "Horovod":
            hvd.broadcast_parameters(net.state_dict(), root_rank=0)
            opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(), op=hvd.Average)

        def step(net=net, opt=opt, x=x, t=t):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), t).backward()
            opt.step()
        ways[way] = step
    return ways


def time_ways(model: str = "mlp", batch: int | None = None, steps: int = 10, reps: int = 5,
              warmup: int = 3) -> dict:
    """Seconds per step of each way (slowest rank) in each of ``reps`` interleaved repetitions, and their
    medians; runs on every rank of the world."""
    from mpi4py import MPI


    batch = BATCH[model] if batch is None else batch
    info = dist.init(horovod=True)
    comm = MPI.COMM_WORLD
    ways = make_ways(model, batch, info.device)
    for fn in ways.values():                   # warm up every way (DDP rebuilds its buckets after step 1)
        alone = fn is ways["1 rank"]
        for _ in range(warmup):
            if not alone or info.rank == 0:
                fn()
        _quiet_barrier(comm)
    per_rep = {w: [] for w in ways}
    for _ in range(reps):
        for way, fn in ways.items():
            alone = way == "1 rank"
            _quiet_barrier(comm) if alone else comm.Barrier()
            t0 = time.perf_counter()
            if not alone or info.rank == 0:
                for _ in range(steps):
                    fn()
                synchronize(info.device)
            dt = (time.perf_counter() - t0) / steps if (not alone or info.rank == 0) else 0.0
            _quiet_barrier(comm) if alone else comm.Barrier()
            per_rep[way].append(comm.allreduce(dt, op=MPI.MAX))
    n_params = sum(p.numel() for p in build(model, info.device)[0].parameters())
    return {"seconds": {w: statistics.median(v) for w, v in per_rep.items()}, "per_rep": per_rep,
            "world_size": info.world_size, "batch": batch, "n_params": n_params, "model": model,
            "device": str(info.device), "horovod_comm": _horovod_comm(info.device)}


def _horovod_comm(device) -> str:
    """What Horovod's allreduce of this device's tensors goes through."""
    import horovod.torch as hvd

    if getattr(device, "type", "cpu") == "cuda":
        return "NCCL" if hvd.nccl_built() else "MPI (staged through the host: Horovod was built without NCCL)"
    return "MPI" if hvd.mpi_enabled() else "gloo"


def ratios(res: dict, throughput: bool) -> dict:
    """``{DDP way: (median, min, max)}`` of DDP against Horovod, one ratio per repetition: Horovod's time over
    DDP's (throughput ratio, ``throughput=True``) or DDP's time over Horovod's (step-time ratio)."""
    hvd = res["per_rep"]["Horovod"]
    out = {}
    for way, times in res["per_rep"].items():
        if way.startswith("DDP"):
            r = [(h / d if throughput else d / h) for d, h in zip(times, hvd)]
            out[way] = (statistics.median(r), min(r), max(r))
    return out


def report_model(res: dict) -> str:
    """The table of one model's ways, and DDP against Horovod as a ratio (throughput for the CNN)."""
    s, n, b = res["seconds"], res["world_size"], res["batch"]
    nrep = len(res["per_rep"]["1 rank"])
    lines = [f"model {res['model']} ({res['n_params']:,} parameters), {b} samples per rank per step, {n} ranks "
             f"on {res.get('device', 'cpu')}, median of {nrep} interleaved repetitions; "
             f"Horovod reduces through {res.get('horovod_comm', 'MPI')}",
             f"{'way':<20} {'s/step':>9} {'samples/s':>10} {'weak-scaling eff.':>18} {'vs Horovod':>11} "
             f"{'s/step min-max':>19}"]
    for w in s:
        ranks = 1 if w == "1 rank" else n
        eff = "" if w == "1 rank" else f"{s['1 rank'] / s[w]:.2f}"
        rel = "" if w == "1 rank" else f"{s[w] / s['Horovod']:.3f}x"
        reps = res["per_rep"].get(w) or [s[w]]
        lines.append(f"{w:<20} {s[w]:>9.5f} {ranks * b / s[w]:>10.0f} {eff:>18} {rel:>11} "
                     f"{min(reps):>9.5f}-{max(reps):.5f}")
    throughput = res["model"] == "cnn"
    kind = ("throughput ratio (Horovod's s/step over DDP's; above 1: DDP faster)" if throughput else
            "step-time ratio (DDP's s/step over Horovod's; above 1: DDP slower)")
    lines.append(f"DDP / Horovod {kind}, per repetition, median (min-max) of {nrep}:")
    for way, (med, lo, hi) in ratios(res, throughput).items():
        lines.append(f"  {way:<20} {med:.3f} ({lo:.3f}-{hi:.3f})")
    return "\n".join(lines)


def report_comm(bw: dict, lat: dict, ring_mib: float = 16.0) -> str:
    """The allreduce bandwidths at ``ring_mib`` MiB and the latency of a small allreduce."""
    return "\n".join([
        f"allreduce of {ring_mib:g} MiB, bus bandwidth (nccl-tests convention): "
        + ", ".join(f"{k} {v['busbw'] / 1e9:.2f} GB/s" for k, v in bw.items())
        + f"; ring / MPI = {bw['ring']['busbw'] / bw['mpi']['busbw']:.2f}",
        f"allreduce of 64 floats: gloo {lat['gloo'][0] * 1e6:.1f} µs, MPI {lat['mpi'][0] * 1e6:.1f} µs"])


def lab1_strong(reps: int = 1, scale: str = "laptop", epochs: int = 1) -> dict:
    """Lab 1's segmentation training on 1 and 2 ranks (DDP, the same global batch), 2 ranks in each hook mode,
    interleaved; seconds per step (medians over ``reps``). Every rank calls it."""

    runs = [("1 rank", 1, "default")] + [(f"2 ranks, {w}", 2, m) for w, m in HOOK_WAYS.items()]
    times: dict = {name: [] for name, _, _ in runs}
    before = os.environ.get(mpi_hook.MODE_VAR)
    try:
        for rep in range(reps):
            for name, k, hook in runs:
                os.environ[mpi_hook.MODE_VAR] = hook
                cfg = maize.Config.make(scale, backend="ddp", ranks=k, stages="seg", seg_epochs=epochs, eval=False,
                                        run_name=f"bench-ddp-{k}-{hook}", fresh=True)
                res = maize.train(cfg)
                if res is not None:
                    times[name].append(maize.seconds_per_step(res))
    finally:
        if before is None:
            os.environ.pop(mpi_hook.MODE_VAR, None)
        else:
            os.environ[mpi_hook.MODE_VAR] = before
    return {name: statistics.median(v) for name, v in times.items() if v}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse bench-ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="both", choices=(*MODELS, "both"))
    p.add_argument("--batch", type=int, default=None,
                   help="samples per rank per step (default: " + ", ".join(f"{m} {b}" for m, b in BATCH.items()) + ")")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (the median is reported)")
    p.add_argument("--ring-mib", type=float, default=16.0)
    p.add_argument("--lab1", action="store_true", help="also time lab 1 (maize) on 1 and 2 ranks")
    p.add_argument("--lab1-reps", type=int, default=1)
    p.add_argument("--lab1-scale", default="laptop")
    a = p.parse_args(argv)
    from mpi4py import MPI


    dist.init(horovod=True)
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        raise SystemExit("run it on at least 2 ranks: mpiexec -n 2 python -m ddlcourse bench-ddp")
    for model in (MODELS if a.model == "both" else (a.model,)):
        res = time_ways(model, a.batch, a.steps, a.reps)
        if comm.Get_rank() == 0:
            print(report_model(res) + "\n", flush=True)
    bw = runtimes.bandwidths_at(int(a.ring_mib * (1 << 20)), reps=a.reps)
    lat = runtimes.compare_gloo_mpi([256], reps=20)
    if comm.Get_rank() == 0:
        print(report_comm(bw, lat, a.ring_mib), flush=True)
    if a.lab1:
        lab = lab1_strong(a.lab1_reps, a.lab1_scale)
        if comm.Get_rank() == 0:
            one = lab["1 rank"]
            print(f"lab 1 (maize, {a.lab1_scale}), segmentation, same global batch, median of {a.lab1_reps}:")
            for name, t in lab.items():
                print(f"  {name:<30} {t:.4f} s/step   speedup {one / t:.2f}x")
    comm.Barrier()
    mpi_hook.free_comms()
    dist.shutdown()
    return 0
