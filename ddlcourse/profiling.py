"""Notebook 24 · profiling a data-parallel step: traces per rank, the straggler, exposed communication.

On every rank (an engine through ``parallel.model_parallel.on_first_ranks``, or a process under ``mpiexec``)
:func:`profile_step` runs a few training steps under ``torch.profiler`` and returns the step as intervals::

    res = profile_step(dim=32, hidden=128, depth=3, batch=64, steps=3, group=group, trace_dir=run_dir)
    res["phases"]        # seconds per step: forward, backward, optimizer, allreduce (the collective events)
    res["steps"][i]      # (name, kind, start, stop) of step i's events, in seconds from the barrier that starts it

The step opens ``record_function`` ranges named ``forward``, ``backward`` and ``optimizer``; the
collectives appear by themselves (``gloo:all_reduce`` on CPU ranks, ``nccl:all_reduce`` on GPUs), and the
backward's compute as ``autograd::engine::evaluate_function: ...`` events. Each step lies between the end of
the barrier that starts it and a mark taken once its device work is done, so the next step's barrier (and the
ranks' waiting in it) is in no step. From those intervals:

* :func:`exposed_comm` -- communication time not hidden behind compute (interval arithmetic);
* :func:`collective_calls` -- how many collectives a step called (also where NCCL had nothing to do);
* :func:`find_straggler` -- the rank that waits least in the allreduce is the one the others wait for;
* :func:`plot_step` -- the step of every rank with the course's timeline plot (``plots_timeline``).

Horovod writes its own timeline when ``HOROVOD_TIMELINE`` is set before ``hvd.init()``: a fresh MPI job,
``python -m ddlcourse profile horovod-timeline FILE`` (:func:`run_horovod_timeline` starts it), and
:func:`horovod_phases` reads it. :func:`compare_compile` runs the same DDP model eager and under
``torch.compile`` and compares losses, gradients and step times.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch._dynamo
import torch.distributed as tdist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from ddlcourse import dist
from ddlcourse.device import now, rank_device, synchronize
from ddlcourse.cluster.launch import launch_command, run_job
from ddlcourse.models.small import MLP

PHASES = ("forward", "backward", "optimizer")            # the ranges the step opens
STEP_SIZES = (("dim", 32), ("hidden", 128), ("depth", 3), ("batch", 64), ("steps", 3))   # the CLI's defaults
SYNC = "sync"                                           # the barrier that starts every profiled step
END = "step end"                                        # a mark once the step's device work is done: its end
COMM_NAMES = ("gloo:all_reduce", "nccl:all_reduce")      # the collective's own events (CPU and GPU)
COMPUTE_PREFIX = "autograd::engine::evaluate_function:"  # one backward node's work
LAUNCH = "launch"                                       # on a GPU, the host-side call that launches a collective
N_CLASSES = 10


# =========================================================================== the step
def build(dim: int, hidden: int, depth: int, batch: int, device=None, seed: int = 0):
    """The model (same initial weights on every rank) and this rank's batch (its own seed), on ``device``."""
    device = rank_device(device)
    torch.manual_seed(seed)                           # same weights on every rank: DDP checks it
    model = MLP(dim, N_CLASSES, hidden=hidden, depth=depth).to(device)
    r = tdist.get_rank() if tdist.is_initialized() else 0
    g = torch.Generator().manual_seed(seed + 1000 * (r + 1))
    x = torch.randn(batch, dim, generator=g).to(device)                     # (batch, dim)
    t = torch.randint(0, N_CLASSES, (batch,), generator=g).to(device)      # (batch,)
    return model, x, t


def train_step(model: nn.Module, opt, x, t, delay_s: float = 0.0) -> torch.Tensor:
    """One step in named ranges. ``delay_s``: seconds of extra host time in the forward (a slow rank)."""
    with record_function("forward"):
        if delay_s > 0:
            time.sleep(delay_s)                      # stands for a slow node, a slow data loader, a hot GPU
        loss = F.cross_entropy(model(x), t)
    with record_function("backward"):
        loss.backward()                              # DDP starts each bucket's allreduce from here
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss


def _kind(name: str, on_device: bool = False) -> str | None:
    """The kind of a profiler event, or None to leave it out.

    Host-side events (``on_device=False``) give the phases, the ``sync`` barrier, the ``step end`` mark and,
    on CPU ranks, the collectives and the backward's compute. On a GPU those host-side events only time the
    *launch* of the work; what ran when is in the device-side kernels (``on_device=True``): NCCL's kernels are
    the allreduce, every other kernel is compute. The profiler also copies each ``record_function`` range onto
    the device timeline; those copies are left out (counted twice, they doubled every step and phase)."""
    if on_device:
        if name in PHASES or name in (SYNC, END) or name in COMM_NAMES:
            return None                                  # the GPU-side copy of a host range
        return "allreduce" if "nccl" in name.lower() else "compute"
    if name in PHASES or name in (SYNC, END):
        return name
    if name in COMM_NAMES:
        return "allreduce"
    if name.startswith(COMPUTE_PREFIX):
        return "compute"
    return None


def _on_device(event) -> bool:
    return getattr(getattr(event, "device_type", None), "name", "CPU") != "CPU"


def _step_events(prof_events, n_steps: int, device_timeline: bool = False) -> list[list[tuple]]:
    """Split the profiler's events into steps: each starts at the end of its ``sync`` barrier (time 0) and ends
    at its ``step end`` mark, taken after the step's device work (a synchronize). What starts after the mark (the
    next step's barrier, on a GPU NCCL's kernel that waits for the last rank to arrive) belongs to no step.

    ``device_timeline`` (a GPU run): allreduce and compute come from the device-side kernels, the phases and
    the barrier from the host; the host-side collective is kept as a ``launch`` (it only starts the kernels;
    :func:`collective_calls` counts it). On CPU ranks everything is host-side."""
    evs = []
    for e in prof_events:
        on_device = _on_device(e)
        kind = _kind(e.name, on_device)
        if kind in ("allreduce", "compute") and on_device != device_timeline:
            # on a GPU the host-side event only launches the work: a collective's launch is kept, as such
            kind = LAUNCH if kind == "allreduce" and not on_device else None
        if kind is not None:
            evs.append((e.name, kind, e.time_range.start * 1e-6, e.time_range.end * 1e-6))   # us -> s
    starts = sorted(stop for _, k, _, stop in evs if k == SYNC)
    ends = sorted(start for _, k, start, _ in evs if k == END)
    if len(starts) != n_steps or len(ends) != n_steps:
        raise RuntimeError(f"expected {n_steps} profiled steps, found {len(starts)} '{SYNC}' ranges and "
                           f"{len(ends)} '{END}' marks")
    return [sorted((n, k, a - t0, b - t0) for n, k, a, b in evs if k not in (SYNC, END) and t0 <= a < t1)
            for t0, t1 in zip(starts, ends)]


def phase_times(events) -> dict:
    """Seconds of each phase in one step's events: the ranges, and the time covered by allreduce events."""
    out = {p: sum(b - a for _, k, a, b in events if k == p) for p in PHASES}
    out["allreduce"] = total(intervals(events, "allreduce"))    # gloo's threads overlap: count time once
    return out


def profile_step(dim: int, hidden: int, depth: int, batch: int, steps: int = 3, ddp: bool = True,
                 delay_rank: int | None = None, delay_s: float = 0.0, bucket_cap_mb: float = 25.0,
                 trace_dir: str | None = None, group=None, device=None, seed: int = 0) -> dict:
    """Profile ``steps`` training steps on this rank (after one warm-up step, which is not recorded).

    ``ddp=False`` trains the bare model: the serial step, no gradient exchange. ``delay_rank``/``delay_s``
    make one rank slow. ``trace_dir``: each rank writes its Chrome trace there as ``rank<r>.json``.
    ``group``: the ranks of this run (None: every rank). On a GPU the phases are host-side ranges and the
    allreduce and compute intervals are the device's kernels (when they ran, not when they were launched).
    Returns ``{rank, world_size, steps: [events of each step], phases: {phase: median seconds per step},
    exposed: median exposed communication, trace}``.
    """
    if not tdist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call ddlcourse.dist.init() on every rank first")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if delay_s < 0:
        raise ValueError(f"delay_s must be >= 0, got {delay_s}")
    device = rank_device(device)
    r, n = tdist.get_rank(group), tdist.get_world_size(group)
    if delay_rank is not None and not 0 <= delay_rank < n:
        raise ValueError(f"delay_rank {delay_rank} is not a rank of this run of {n}")
    model, x, t = build(dim, hidden, depth, batch, device, seed)
    if ddp:
        model = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb,
                    device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    delay = delay_s if r == delay_rank else 0.0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps + 1):
            with record_function(SYNC):
                tdist.barrier(group=group)           # every rank starts the step together: a common time 0
            train_step(model, opt, x, t, delay_s=delay)
            synchronize(device)                      # the step's GPU work belongs to this step
            with record_function(END):
                pass                                 # the step ends here, before the next step's barrier
    # the first recorded step carries the profiler's own start-up cost (and DDP's first-step set-up): dropped
    per_step = _step_events(prof.events(), steps + 1, device_timeline=device.type == "cuda")[1:]
    trace = None
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        trace = str(Path(trace_dir) / f"rank{r}.json")
        prof.export_chrome_trace(trace)
    phases = {k: float(np.median([phase_times(s)[k] for s in per_step])) for k in (*PHASES, "allreduce")}
    exposed = float(np.median([exposed_comm(intervals(s, "allreduce"), intervals(s, "compute")) for s in per_step]))
    return dict(rank=r, world_size=n, ddp=ddp, steps=per_step, phases=phases, exposed=exposed, trace=trace,
                delay_rank=delay_rank, delay_s=delay_s)


def intervals(events, kind: str) -> list[tuple[float, float]]:
    """``(start, stop)`` of the events of one kind (``"allreduce"``, ``"compute"``, ``"backward"`` ...)."""
    return [(a, b) for _, k, a, b in events if k == kind]


def collective_calls(events) -> int:
    """How many collectives one step's events show the rank calling: the host-side ``gloo:all_reduce`` or
    ``nccl:all_reduce`` events. On a GPU they count the calls even where NCCL launches no kernel (an in-place
    sum on a communicator of one rank has nothing to do), so the allreduce *time* can be zero there."""
    return sum(1 for name, *_ in events if name in COMM_NAMES)


# =========================================================================== interval arithmetic
def union(iv) -> list[tuple[float, float]]:
    """Sorted, non-overlapping intervals covering the same time as ``iv`` (overlaps merged)."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in iv):
        if b < a:
            raise ValueError(f"an interval ends before it starts: ({a}, {b})")
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(iv) -> float:
    """Time covered by ``iv``, overlaps counted once."""
    return sum(b - a for a, b in union(iv))


def subtract(iv, minus) -> list[tuple[float, float]]:
    """The parts of ``iv`` not covered by ``minus``."""
    out = []
    cuts = union(minus)
    for a, b in union(iv):
        for c, d in cuts:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def exposed_comm(comm_intervals, compute_intervals) -> float:
    """Communication time during which no compute runs: |union(comm) minus union(compute)|, in seconds.

    DDP's buckets overlap their allreduce with the rest of the backward pass; only the exposed part
    lengthens the step.
    """
    return total(subtract(comm_intervals, compute_intervals))


def find_straggler(waits) -> int:
    """The rank the others wait for: the one with the *shortest* allreduce wait.

    ``waits``: seconds per rank (a list indexed by rank, or a dict rank -> seconds). Every other rank
    reaches the collective first and waits for the straggler; the straggler arrives last and waits least.
    """
    items = sorted(waits.items()) if isinstance(waits, dict) else list(enumerate(waits))
    if not items:
        raise ValueError("no ranks given")
    return int(min(items, key=lambda kv: kv[1])[0])


# =========================================================================== pictures
PHASE_KINDS = {"forward": "F", "backward": "B"}       # the timeline plot's own kinds and colours
OPT_COLOR, COMM_COLOR = "grey", "#55A868"     # grey: what plot_timeline gives a kind it does not know


def plot_step(results, step: int = -1, ax=None, title: str = ""):
    """One step of every rank: forward, backward and optimizer on the rank's row, the allreduce events under it.

    Drawn with :func:`ddlcourse.plots_timeline.plot_timeline` (one row per rank); the collectives, which
    run on gloo's or NCCL's own threads at the same time as the backward, are thin bars at the row's foot.
    """
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    from ddlcourse.plots_timeline import COLORS, plot_timeline

    rows = []
    for res in results:
        for name, kind, a, b in res["steps"][step]:
            if kind in PHASE_KINDS:
                rows.append((res["rank"], PHASE_KINDS[kind], 0, a, b))
            elif kind == "optimizer":
                rows.append((res["rank"], "O", 0, a, b))      # not a kind of plot_timeline: drawn grey
    ax = plot_timeline(rows, ax=ax, title=title, label_micro_batches=False)
    for res in results:
        for a, b in intervals(res["steps"][step], "allreduce"):
            ax.barh(res["rank"] + 0.3, (b - a) * 1e3, left=a * 1e3, height=0.2, color=COMM_COLOR)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in (COLORS["F"], COLORS["B"], OPT_COLOR,
                                                                       COMM_COLOR)],
              labels=["forward", "backward", "optimizer", "allreduce (gloo/NCCL thread)"], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))            # beside the rows, not over them
    return ax


# =========================================================================== Horovod's timeline
def horovod_timeline_job(path: str, dim: int, hidden: int, depth: int, batch: int, steps: int) -> None:
    """One rank of a Horovod job that writes its timeline to ``path`` (run it under ``mpiexec``).

    ``HOROVOD_TIMELINE`` is read by ``hvd.init()``: it must be set before Horovod starts, so this runs in a
    fresh process, never on engines where Horovod is already up.
    """
    os.environ["HOROVOD_TIMELINE"] = str(path)      # before dist.init starts Horovod

    info = dist.init(horovod=True)
    import horovod.torch as hvd  # lazy: Horovod is optional (not every install builds it)

    model, x, t = build(dim, hidden, depth, batch, info.device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), t).backward()
        opt.step()
    synchronize(info.device)
    dist.shutdown()                                  # Horovod closes the timeline's JSON array


def run_horovod_timeline(path, n: int = 2, dim: int = 32, hidden: int = 128, depth: int = 3, batch: int = 64,
                         steps: int = 3, timeout: float = 240.0) -> Path:
    """Start ``python -m ddlcourse profile horovod-timeline path`` on ``n`` ranks and wait for it.

    Launched as the course's clusters are (:func:`ddlcourse.cluster.launch.launch_command`): ``srun --overlap`` inside
    a Slurm allocation; else the venv's or site's ``mpiexec`` with its own flags (MPICH and Open MPI differ).
    Call it from the notebook's kernel (not from an engine: an MPI process does not start another MPI job
    cleanly), while no engines run: before Slurm 22.05 ``--overlap`` shares a running step's CPUs but not its
    GPUs, so beside the engines' step this job would wait for their GPUs until ``timeout``. Run by
    :func:`ddlcourse.cluster.launch.run_job`: a start-up broken in Slurm's PMI is started again, and a job still
    running after ``timeout`` s is ended. Raises with the job's output when it fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    _, launcher, launcher_args = launch_command(n)
    cmd = [*launcher, "-n", str(n), *launcher_args,
           sys.executable, "-m", "ddlcourse", "profile", "horovod-timeline", str(path), "--dim", str(dim),
           "--hidden", str(hidden), "--depth", str(depth), "--batch", str(batch), "--steps", str(steps)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI_LOCALRANKID"))}
    p = run_job(cmd, env=env, timeout=timeout, what="the Horovod timeline job")
    if p.returncode != 0 or not path.exists():
        raise RuntimeError(f"the Horovod timeline job failed ({p.returncode}):\n{p.stdout[-4000:]}")
    return path


def read_horovod_timeline(path) -> list[dict]:
    """The events of a Horovod timeline (Chrome trace format: a JSON array), also of an unfinished file."""
    text = Path(path).read_text().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:                     # the job died before Horovod closed the array
        return json.loads(text.rstrip(",") + "]")


def horovod_phases(events) -> dict:
    """``{phase: seconds}`` summed over tensors: NEGOTIATE_ALLREDUCE, ALLREDUCE, MPI_ALLREDUCE, ...

    Each tensor is a "process" (``pid``) of the trace with nested ``B``/``E`` pairs; the names of the
    tensors are in ``process_name`` metadata events.
    """
    open_: dict = {}
    out: dict = {}
    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "B":
            open_.setdefault(pid, []).append((e["name"], e["ts"]))
        elif ph == "E" and open_.get(pid):
            name, ts = open_[pid].pop()
            out[name] = out.get(name, 0.0) + (e["ts"] - ts) * 1e-6
        elif ph == "X" and e.get("dur", 0) > 0:
            out[e["name"]] = out.get(e["name"], 0.0) + e["dur"] * 1e-6
    return out


def horovod_tensors(events) -> list[str]:
    """The tensor names of a Horovod timeline (one trace "process" each)."""
    return [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and "name" in e.get("args", {})]


# =========================================================================== torch.compile on DDP
def compare_compile(dim: int, hidden: int, depth: int, batch: int, steps: int = 5, backend: str = "inductor",
                    bucket_cap_mb: float = 25.0, group=None, device=None, seed: int = 0) -> dict:
    """The same DDP model eager and under ``torch.compile``: first-step loss and gradients, compile time,
    and the median step time of each (timed steps interleaved, so both see the same machine load).
    """
    if not tdist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call ddlcourse.dist.init() on every rank first")

    torch._dynamo.reset()                            # a fresh compile on every call (no cached graphs)
    device = rank_device(device)
    base, x, t = build(dim, hidden, depth, batch, device, seed)
    ids = [device.index] if device.type == "cuda" else None
    eager = DDP(base, process_group=group, bucket_cap_mb=bucket_cap_mb, device_ids=ids)
    compiled = torch.compile(DDP(copy.deepcopy(base), process_group=group, bucket_cap_mb=bucket_cap_mb,
                                 device_ids=ids), backend=backend)

    def fwd_bwd(m):
        loss = F.cross_entropy(m(x), t)
        loss.backward()
        return loss

    loss_e = fwd_bwd(eager)
    t0 = now(device)
    loss_c = fwd_bwd(compiled)                       # compiles forward and backward, then runs them
    compile_s = now(device) - t0
    grad_diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(eager.parameters(), compiled.parameters()))
    grad_scale = max(float(p.grad.abs().max()) for p in eager.parameters())
    times: dict = {"eager": [], "compiled": []}
    for _ in range(steps):
        for name, m in (("eager", eager), ("compiled", compiled)):
            m.zero_grad(set_to_none=True)
            tdist.barrier(group=group)
            t0 = now(device)
            fwd_bwd(m)
            times[name].append(now(device) - t0)
    loss_e, loss_c = float(loss_e.detach()), float(loss_c.detach())
    return dict(rank=tdist.get_rank(group), loss_diff=abs(loss_e - loss_c), loss=loss_e,
                grad_diff=grad_diff, grad_scale=grad_scale, compile_s=compile_s, backend=backend,
                eager_s=float(np.median(times["eager"])), compiled_s=float(np.median(times["compiled"])))


# =========================================================================== command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse profile",
                                description="Profiling helpers of notebook 24 (profiling a data-parallel step).")
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("horovod-timeline", help="train a few Horovod steps with HOROVOD_TIMELINE=FILE (under mpiexec)")
    h.add_argument("file")
    for k, v in STEP_SIZES:
        h.add_argument(f"--{k}", type=int, default=v)
    st = sub.add_parser("step", help="profile a DDP step on every rank (under mpiexec or srun) and print its "
                                     "phases: env/gpu_smoke.sh's check that the profile reads right on a GPU")
    for k, v in STEP_SIZES:
        st.add_argument(f"--{k}", type=int, default=v)
    a = p.parse_args(argv)
    if a.cmd == "horovod-timeline":
        horovod_timeline_job(a.file, a.dim, a.hidden, a.depth, a.batch, a.steps)
    elif a.cmd == "step":
        return step_job(a.dim, a.hidden, a.depth, a.batch, a.steps)
    return 0


def step_job(dim: int, hidden: int, depth: int, batch: int, steps: int) -> int:
    """One rank: :func:`profile_step`, then one line of what it read. Exit 1 when a phase or a step's
    collective call is missing."""
    info = dist.init()
    try:
        res = profile_step(dim, hidden, depth, batch, steps=steps, device=info.device)
    finally:
        dist.shutdown()
    ph = res["phases"]
    calls = [collective_calls(s) for s in res["steps"]]
    # one rank has nothing to reduce: NCCL then launches no kernel at all for DDP's in-place allreduce (its call
    # is still seen)
    needed = (*PHASES, "allreduce") if res["world_size"] > 1 else PHASES
    missing = [f"no time in {k}" for k in needed if not ph[k] > 0] + (["a step without a collective call"]
                                                                     if min(calls) == 0 else [])
    print(f"profile: rank {res['rank']} of {res['world_size']} on {info.device}: {len(res['steps'])} steps; "
          + ", ".join(f"{k} {1e3 * v:.3f} ms" for k, v in ph.items()) + f"; exposed {1e3 * res['exposed']:.3f} ms"
          + f"; collective calls per step {calls}" + (f"; PROBLEM: {', '.join(missing)}" if missing else ""),
          flush=True)
    return 1 if missing or len(res["steps"]) != steps else 0
