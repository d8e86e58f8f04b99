"""Training that survives a killed rank: checkpoints, resume from the latest one, ``torchrun`` elastic restarts.

One training loop, :func:`train_loop`, used two ways:

* under ``torchrun`` (``python -m ddlcourse.elastic ...``, started by :func:`run_torchrun`)::

      torchrun --nnodes=1:2 --nproc-per-node=2 --max-restarts=2 --rdzv-backend=c10d \\
               --rdzv-endpoint=127.0.0.1:PORT -m ddlcourse.elastic --ckpt-dir DIR --steps 40 --every 10 --kill-at 27

  When a worker dies, torchrun's agent stops the others, meets again at the rendezvous and starts all workers
  afresh (``TORCHELASTIC_RESTART_COUNT`` counts the restarts); the loop then resumes from the latest checkpoint.
* on the engines of an ipyparallel cluster (:func:`run_on_engine`): the notebook sees the engine die
  (``MPICluster.run`` raises ``ClusterError``), starts a new cluster and calls it again.

Checkpoints are written by rank 0 only (data parallelism: every rank holds the same model and optimizer state),
atomically (a temporary file, then ``os.replace``: the course's one checkpoint write,
:func:`ddlcourse.training.checkpoint.atomic_save`), as ``step_<completed steps>.pt``. Batches are a function of
the step number, so a resumed run repeats exactly the steps it lost: their losses are logged twice, once per
attempt, and must agree.

To kill a rank on purpose, ``kill_at=K`` makes rank ``kill_rank`` SIGKILL itself after completing step K, once
(a marker file in the checkpoint directory remembers that it happened).
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddlcourse import dist
from ddlcourse.device import rank_device
from ddlcourse.training.checkpoint import atomic_save, load_into

CKPT = re.compile(r"^step_(\d+)\.pt$")
KILLED_MARKER = "killed-once"
LOG = "log.jsonl"


# --------------------------------------------------------------------------- checkpoints
def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}.pt"


def resume_step(names) -> int:
    """The number of completed steps of the latest *complete* checkpoint among file names ``names`` (0: none).

    Complete: named ``step_<N>.pt`` exactly (a ``.tmp`` file is a write that did not finish). The number is
    compared as a number, not as text (``step_9.pt`` comes before ``step_10.pt``).
    """
    steps = [int(m.group(1)) for m in (CKPT.match(os.path.basename(str(n))) for n in names) if m]
    return max(steps, default=0)


def save_checkpoint(directory, step: int, model: nn.Module, optimizer) -> Path:
    """Write ``step_<step>.pt`` atomically: a crash while writing leaves only a ``.tmp`` file behind."""
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    return atomic_save(state, Path(directory) / checkpoint_name(step))


def agreed_step(directory, group=None, device=None) -> int:
    """The step every rank resumes from: rank 0 of ``group`` lists ``directory`` and broadcasts what it found.

    Each rank must not list the folder itself: on an NFS home a node may be shown a listing cached for 30-60 s,
    without the newest checkpoint, and its ranks would resume from an older step than the others; their
    collectives then no longer match, and the job hangs until NCCL's watchdog ends it. Without
    ``torch.distributed`` (one process) the listing is this process's own.
    """
    d = Path(directory)
    if not tdist.is_initialized():
        return resume_step(os.listdir(d)) if d.is_dir() else 0
    step = torch.zeros(1, dtype=torch.int64, device=rank_device(device))
    if tdist.get_rank(group) == 0:
        step[0] = resume_step(os.listdir(d)) if d.is_dir() else 0
    tdist.broadcast(step, group=group, group_src=0)      # NEW: rank 0's choice, on every rank
    return int(step.item())


def load_latest(directory, model: nn.Module, optimizer, device=None, group=None) -> int:
    """Load the latest complete checkpoint of ``directory`` into ``model``/``optimizer``; its step (0: none).

    On the ranks of ``group`` every rank loads the one rank 0 chose (:func:`agreed_step`). A file that cannot
    be read or does not fit the model raises ``training.CheckpointError``, naming it."""
    d = Path(directory)
    step = agreed_step(d, group, device)
    if step == 0:
        return 0
    state = load_into(d / checkpoint_name(step), model, optimizer, map_location=rank_device(device))
    return int(state["step"])


# --------------------------------------------------------------------------- the training loop
def make_model(dim: int = 16, hidden: int = 32, n_classes: int = 4, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


def batch(step: int, global_batch: int = 64, dim: int = 16, n_classes: int = 4, seed: int = 0):
    """The global batch of step ``step``: a function of the step, so a resumed run sees the same data."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(global_batch, dim, generator=g)
    w = torch.randn(dim, n_classes, generator=torch.Generator().manual_seed(seed))
    return x, (x @ w).argmax(1)


def attempt_number() -> int:
    """torchrun's restart count (0 on the first attempt); ``$DDLCOURSE_ATTEMPT`` elsewhere."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get("DDLCOURSE_ATTEMPT", "0")))


def _log(directory: Path, record: dict) -> None:
    with open(directory / LOG, "a") as f:
        f.write(json.dumps(record) + "\n")


def train_loop(ckpt_dir, steps: int = 40, every: int = 10, kill_at: int | None = None, kill_rank: int = 1,
               hidden: int = 32, global_batch: int = 64, lr: float = 0.1, attempt: int | None = None,
               group=None, device=None) -> dict:
    """Data-parallel training (DDP) that checkpoints every ``every`` steps and resumes from the latest checkpoint.

    Needs ``torch.distributed`` initialised. Rank 0 appends ``{"attempt", "step", "loss", "time"}`` per step and
    ``{"attempt", "resumed_from"}`` at the start to ``<ckpt_dir>/log.jsonl``. Returns this attempt's summary.
    """
    device = rank_device(device)
    d = Path(ckpt_dir)
    r, n = tdist.get_rank(group), tdist.get_world_size(group)
    if global_batch % n:
        raise ValueError(f"global_batch {global_batch} must divide evenly over {n} ranks")
    if every < 1 or steps < 1:
        raise ValueError(f"steps ({steps}) and every ({every}) must be at least 1")
    attempt = attempt_number() if attempt is None else attempt
    if r == 0:
        d.mkdir(parents=True, exist_ok=True)
    tdist.barrier(group=group)
    model = make_model(hidden=hidden).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)   # momentum: optimizer state must be resumed too
    start = load_latest(d, model, opt, device, group)   # NEW: 0 on the first attempt; rank 0 picks it for all
    ddp = DDP(model, process_group=group)
    if r == 0:
        _log(d, {"attempt": attempt, "resumed_from": start, "world_size": n, "time": time.time()})
    per = global_batch // n
    losses = []
    for step in range(start, steps):
        x, y = batch(step, global_batch)
        x, y = x[r * per:(r + 1) * per].to(device), y[r * per:(r + 1) * per].to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        tdist.all_reduce(mean, group=group)
        losses.append(float(mean) / n)
        done = step + 1
        if r == 0:
            _log(d, {"attempt": attempt, "step": done, "loss": losses[-1], "time": time.time()})
        if done % every == 0 or done == steps:
            if r == 0:
                save_checkpoint(d, done, model, opt)     # NEW: rank 0 alone writes
            tdist.barrier(group=group)      # NEW: nobody runs ahead of a checkpoint that is not on disk yet
        if kill_at is not None and done == kill_at and r == kill_rank and not (d / KILLED_MARKER).exists():
            (d / KILLED_MARKER).write_text(f"rank {r} killed itself after step {done}\n")
            os.kill(os.getpid(), signal.SIGKILL)
    return {"attempt": attempt, "resumed_from": start, "losses": losses, "rank": r}


def run_on_engine(ckpt_dir, **kwargs) -> dict:
    """On an ipyparallel engine: initialise ``torch.distributed`` from MPI and run :func:`train_loop`."""
    dist.init()
    return train_loop(ckpt_dir, **kwargs)


# --------------------------------------------------------------------------- reading the log
def read_log(ckpt_dir) -> list[dict]:
    p = Path(ckpt_dir) / LOG
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def summarize(log: list[dict], every: int, kill_at: int | None) -> dict:
    """What the log says about a run: attempts, where each resumed, lost steps, and whether repeats agree.

    ``lost_steps``: steps done before the kill that had to be done again (at most ``every``, the checkpoint
    interval). ``repeats_agree``: every step run twice logged the same loss both times (an exact resume).
    ``restart_seconds``: from the last step logged before the kill to the first step logged after it.
    """
    starts = [e for e in log if "resumed_from" in e]
    steps = [e for e in log if "step" in e]
    by_step: dict[int, list[float]] = {}
    for e in steps:
        by_step.setdefault(e["step"], []).append(e["loss"])
    repeated = {s: v for s, v in by_step.items() if len(v) > 1}
    out = {"attempts": len(starts), "resumed_from": [e["resumed_from"] for e in starts],
           "last_step": max((e["step"] for e in steps), default=0), "repeated_steps": sorted(repeated),
           "repeats_agree": all(max(v) - min(v) <= 1e-6 * max(1.0, abs(v[0])) for v in repeated.values())}
    if kill_at is not None and len(starts) > 1:
        resumed = starts[1]["resumed_from"]
        out["expected_resume"] = (kill_at // every) * every
        out["resumes_at_saved_step"] = resumed == out["expected_resume"]
        out["lost_steps"] = kill_at - resumed
        first = [e for e in steps if e["attempt"] == starts[0]["attempt"]]
        second = [e for e in steps if e["attempt"] == starts[1]["attempt"]]
        if first and second:
            out["restart_seconds"] = second[0]["time"] - first[-1]["time"]
    out["losses"] = [by_step[s][-1] for s in sorted(by_step)]
    return out


def require_resumed(summary: dict, steps: int, what: str = "the run", output: str = "") -> dict:
    """``summary`` (from :func:`summarize` with ``kill_at``) if the run was restarted and finished all ``steps``;
    otherwise a ``RuntimeError`` that says how far it got (and the end of the launcher's ``output``)."""
    if summary.get("attempts", 0) >= 2 and "lost_steps" in summary and summary.get("last_step") == steps:
        return summary
    raise RuntimeError(
        f"{what} did not restart and finish: {summary.get('attempts', 0)} attempt(s) logged, resumed from "
        f"{summary.get('resumed_from', [])}, last step {summary.get('last_step', 0)} of {steps}"
        + (f"; the launcher's output ends with:\n{output[-1500:]}" if output else ""))


# --------------------------------------------------------------------------- torchrun
def free_port() -> int:
    """A TCP port free on loopback now (the rendezvous endpoint; torchrun needs a number up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(ckpt_dir, nproc: int = 2, max_restarts: int = 3, port: int | None = None,
                     **train_args) -> list[str]:
    """The ``torchrun`` command line (``python -m torch.distributed.run``) for :func:`main`."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", f"--nproc-per-node={nproc}",
           f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           # with a range of nodes the rendezvous waits last_call_timeout (30 s) for late nodes; one node here
           "--rdzv-conf=last_call_timeout=1", "--monitor-interval=0.2", "-m", "ddlcourse.elastic",
           "--ckpt-dir", str(ckpt_dir)]
    for k, v in train_args.items():
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def _kill_group(pgid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + grace
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def workers_here(nproc: int) -> int:
    """The workers torchrun may start on this node: ``nproc``, but on a GPU node at most one per GPU (torchrun
    runs on the notebook's node only; a worker without a GPU of its own would fail to start)."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and nproc > gpus:
        print(f"torchrun: {nproc} workers asked for, {gpus} GPU(s) on this node: starting {gpus}")
        return gpus
    return nproc


def run_torchrun(ckpt_dir, nproc: int = 2, max_restarts: int = 3, timeout: float = 300.0, **train_args) -> dict:
    """Run :func:`main` under torchrun in its own process group; always leaves no process behind.

    Returns ``{"returncode", "seconds", "output" (last 3000 characters), "log" (the parsed log.jsonl)}``.
    """
    nproc = workers_here(nproc)
    cmd = torchrun_command(ckpt_dir, nproc, max_restarts, **train_args)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)        # its own group: torchrun, its agent and workers
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, _ = proc.communicate()
        raise RuntimeError(f"torchrun did not finish within {timeout:.0f} s; output:\n{out[-3000:]}") from None
    finally:
        _kill_group(proc.pid)      # workers of a failed attempt may outlive the agent: take the group down
    return {"returncode": proc.returncode, "seconds": time.perf_counter() - t0, "output": out[-3000:],
            "log": read_log(ckpt_dir)}


def generation_store(timeout: datetime.timedelta):
    """The rendezvous store of this worker's generation, with its rank and world size, from torchrun's env.

    With the c10d rendezvous (and the static one), torchrun's agent hosts ONE TCP store for the whole job
    (``TORCHELASTIC_USE_AGENT_STORE=True``), and every generation of workers meets in it. A plain
    ``init_process_group("gloo")`` (``env://``) uses the same key names in every generation, so the workers of
    a restart can read the addresses that the killed generation left there and try to connect to dead
    processes: the restart hangs in ``init_process_group`` until its timeout, or fails with "connection
    refused". Prefixing the keys with the generation (``TORCHELASTIC_RESTART_COUNT``) gives every restart a
    clean namespace.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = tdist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=(not agent_hosts and rank == 0), timeout=timeout)
    return tdist.PrefixStore(f"ddlcourse/generation_{attempt_number()}", base), rank, world


def main(argv=None) -> None:
    """Entry point under torchrun: one worker of the elastic job."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a hung collective fails")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    # a hung collective (a peer gone during the restart) fails after this and torchrun tries again
    timeout = datetime.timedelta(seconds=a.timeout)
    # Safety net: a worker not in the process group within the timeout prints every thread's Python stack
    # (to see where it hung) and exits with an error, and the agent tries again.
    faulthandler.dump_traceback_later(a.timeout, exit=True)
    # torchrun, not MPI, started this process: rank, world size and the store come from its environment
    store, rank, world = generation_store(timeout)
    if torch.cuda.is_available():
        # one visible GPU (bound per task) is cuda:0; else the local rank's
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        tdist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=rank, world_size=world,
                                 device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        tdist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    tdist.barrier()
    faulthandler.cancel_dump_traceback_later()
    try:
        train_loop(a.ckpt_dir, steps=a.steps, every=a.every, kill_at=a.kill_at, kill_rank=a.kill_rank,
                   hidden=a.hidden, device=device)
    finally:
        tdist.destroy_process_group()


def plot_attempts(log: list[dict], every: int, kill_at: int | None = None, ax=None, title: str = ""):
    """Loss per step, one line per attempt; checkpoints as dotted lines, the kill as a red one."""
    import matplotlib.pyplot as plt     # lazy: slow to import, and only a notebook draws

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.8))
    attempts = sorted({e["attempt"] for e in log if "step" in e})
    for a in attempts:
        pts = [(e["step"], e["loss"]) for e in log if e.get("attempt") == a and "step" in e]
        ax.plot(*zip(*pts), "o-" if a == attempts[0] else "s--", ms=3, label=f"attempt {a}")
    last = max((e["step"] for e in log if "step" in e), default=0)
    for s in range(every, last + 1, every):
        ax.axvline(s, color="grey", ls=":", lw=0.8)
    if kill_at is not None:
        ax.axvline(kill_at, color="red", lw=1.2, label="rank killed")
    ax.set_xlabel("step (dotted: checkpoints)")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return ax


if __name__ == "__main__":
    main()
