"""Notebook 09 · the parameter server (:mod:`ddlcourse.parallel.param_server`) trained against serial and allreduce,
asynchronous and stale; its traffic measured; local SGD."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ddlcourse import dist
from ddlcourse.collectives import ring_allreduce
from ddlcourse.data.toy import teacher_classification
from ddlcourse.device import rank_device
from ddlcourse.models.small import MLP
from ddlcourse.parallel.param_server import PARAM, push_pull, send_params, serve, shard_bounds


class Problem:
    """The MLP, its data and flat-vector access, the same on every rank (seeded)."""

    def __init__(self, n_train: int = 256, dim: int = 16, hidden: int = 32, n_classes: int = 4, seed: int = 0,
                 device=None):
        self.device = rank_device(device)
        X, y = teacher_classification(n_train, dim=dim, n_classes=n_classes, seed=seed)
        self.X, self.y = X.double().to(self.device), y.to(self.device)
        torch.manual_seed(seed)
        self.model = MLP(dim, n_classes, hidden=hidden).double().to(self.device)
        self.n_train = n_train

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def get(self) -> np.ndarray:
        """The parameters as one flat float64 host array (a copy)."""
        return nn.utils.parameters_to_vector(self.model.parameters()).detach().cpu().numpy().copy()

    def set(self, flat: np.ndarray) -> None:
        nn.utils.vector_to_parameters(torch.from_numpy(np.asarray(flat)).to(self.device), self.model.parameters())

    def batch(self, step: int, global_batch: int, share: int = 0, n_shares: int = 1) -> torch.Tensor:
        """Indices of share ``share`` (of ``n_shares`` equal ones) of step ``step``'s global batch."""
        if global_batch % n_shares:
            raise ValueError(f"global_batch {global_batch} must be divisible by {n_shares} workers")
        idx = (torch.arange(global_batch, device=self.device) + step * global_batch) % self.n_train
        return idx[share::n_shares]

    def grad(self, flat: np.ndarray, idx: torch.Tensor) -> tuple[np.ndarray, float]:
        """``(gradient, loss)`` of the mean cross-entropy on samples ``idx`` at parameters ``flat``."""
        self.set(flat)
        self.model.zero_grad()
        loss = nn.functional.cross_entropy(self.model(self.X[idx]), self.y[idx])
        loss.backward()
        g = torch.cat([p.grad.flatten() for p in self.model.parameters()])
        return g.detach().cpu().numpy(), loss.item()

    def loss(self, flat: np.ndarray) -> float:
        """Loss on the whole training set."""
        self.set(flat)
        with torch.no_grad():
            return float(nn.functional.cross_entropy(self.model(self.X), self.y))


def _split(comm, n_servers: int):
    n = comm.Get_size()
    if not 1 <= n_servers < n:
        raise ValueError(f"need 1 <= n_servers < ranks ({n}), got n_servers={n_servers}")
    return list(range(n_servers)), list(range(n_servers, n))


def train_ps(steps: int = 10, global_batch: int = 24, lr: float = 0.1, n_servers: int = 1, sync: bool = True,
             comm=None, worker_exchange=None, **problem) -> dict:
    """Train the MLP with a parameter server; runs on every rank of ``comm`` (default: the world).

    Returns on every rank ``{"params"}`` (the final flat parameters, gathered from the servers), plus on workers
    ``{"losses", "worker_params"}`` (this worker's mini-batch loss per step, its last pulled parameters) and on servers ``{"staleness", "sent", "received"}``.
    ``worker_exchange``: the workers' push/pull (default :func:`push_pull`; the exercise passes the learner's).
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = comm if comm is not None else MPI.COMM_WORLD
    comm = comm.Dup()                         # a private context: a failed run leaves no message behind
    servers, workers = _split(comm, n_servers)
    r = comm.Get_rank()
    prob = Problem(**problem)
    shards = shard_bounds(prob.n_params, n_servers)
    exchange = worker_exchange or push_pull
    out: dict = {}
    if r in servers:
        a, b = shards[r]
        shard = prob.get()[a:b].copy()       # every rank built the same initial model; the server's copy rules
        send_params(comm, shard, workers)    # the workers' first pull
        out.update(serve(comm, shard, workers, steps, lr, sync=sync))
        mine = shard
    else:
        params = np.empty(prob.n_params)
        for s, (a, b) in enumerate(shards):
            comm.Recv(params[a:b], source=s, tag=PARAM)
        i, W = workers.index(r), len(workers)
        losses = []
        for step in range(steps):
            g, loss = prob.grad(params, prob.batch(step, global_batch, i, W))
            exchange(comm, g, params, shards)
            losses.append(loss)
        out["losses"] = losses
        out["worker_params"] = params
        mine = np.empty(0)
    pieces = comm.allgather(mine if r in servers else None)
    out["params"] = np.concatenate([pieces[s] for s in servers])
    comm.Free()
    return out


def train_serial(steps: int = 10, global_batch: int = 24, lr: float = 0.1, **problem) -> dict:
    """The reference: one process, plain SGD on the whole global batch."""
    prob = Problem(**problem)
    p = prob.get()
    losses = []
    for step in range(steps):
        g, loss = prob.grad(p, prob.batch(step, global_batch))
        p = p - lr * g
        losses.append(loss)
    return {"params": p, "losses": losses}


def train_allreduce(steps: int = 10, global_batch: int = 24, lr: float = 0.1, comm=None, **problem) -> dict:
    """Allreduce data parallelism on every rank of ``comm``: average the gradients, step everywhere."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = comm if comm is not None else MPI.COMM_WORLD
    prob = Problem(**problem)
    p = prob.get()
    r, n = comm.Get_rank(), comm.Get_size()
    losses = []
    for step in range(steps):
        g, loss = prob.grad(p, prob.batch(step, global_batch, r, n))
        comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
        p = p - lr * g / n
        losses.append(comm.allreduce(loss) / n)
    return {"params": p, "losses": losses}


def compare_sync(steps: int = 5, global_batch: int = 24, lr: float = 0.1, n_servers: int = 1, comm=None,
                 **problem) -> dict:
    """Max |difference| of the final parameters: synchronous PS vs serial, allreduce vs serial (every rank)."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = comm if comm is not None else MPI.COMM_WORLD
    kw = dict(steps=steps, global_batch=global_batch, lr=lr, **problem)
    serial = train_serial(**kw)["params"]
    ps = train_ps(n_servers=n_servers, comm=comm, **kw)["params"]
    ar = train_allreduce(comm=comm, **kw)["params"]
    d = {"ps_vs_serial": float(np.abs(ps - serial).max()), "allreduce_vs_serial": float(np.abs(ar - serial).max())}
    return {k: comm.allreduce(v, op=MPI.MAX) for k, v in d.items()}


def train_async(steps: int = 10, global_batch: int = 24, lr: float = 0.1, n_servers: int = 1, comm=None,
                **problem) -> dict:
    """An asynchronous PS run: the staleness each server saw (list of ints) and the final training loss.

    The order in which gradients arrive depends on timing, so this run is not reproducible: it measures.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = comm if comm is not None else MPI.COMM_WORLD
    res = train_ps(steps=steps, global_batch=global_batch, lr=lr, n_servers=n_servers, sync=False, comm=comm,
                   **problem)
    stale = comm.allgather(res.get("staleness", []))
    return {"staleness": [s for part in stale for s in part],
            "final_loss": Problem(**problem).loss(res["params"])}


def train_stale(staleness: int, steps: int = 50, global_batch: int = 24, lr: float = 0.1, **problem) -> dict:
    """Deterministic emulation of asynchronous SGD in one process: the step at time t uses the gradient computed
    at the parameters of time ``t - staleness`` (``staleness = 0`` is plain synchronous SGD). Returns the
    training-set loss after every step."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    prob = Problem(**problem)
    history = [prob.get()]
    losses = []
    for step in range(steps):
        old = history[max(0, len(history) - 1 - staleness)]
        g, _ = prob.grad(old, prob.batch(step, global_batch))
        history.append(history[-1] - lr * g)
        history = history[-(staleness + 1):]
        losses.append(prob.loss(history[-1]))
    return {"losses": losses, "params": history[-1]}


class CountingComm:
    """Wraps an mpi4py communicator and counts the bytes this rank sends and receives point to point."""

    def __init__(self, comm):
        self.comm, self.sent, self.received = comm, 0, 0

    def Get_rank(self):
        return self.comm.Get_rank()

    def Get_size(self):
        return self.comm.Get_size()

    def Sendrecv(self, sendbuf, dest, recvbuf, source, **kw):
        self.sent += np.asarray(sendbuf).nbytes
        self.received += np.asarray(recvbuf).nbytes
        return self.comm.Sendrecv(sendbuf, dest=dest, recvbuf=recvbuf, source=source, **kw)

    def Send(self, buf, dest, **kw):
        self.sent += np.asarray(buf).nbytes
        return self.comm.Send(buf, dest=dest, **kw)

    def Recv(self, buf, source, **kw):
        self.received += np.asarray(buf).nbytes
        return self.comm.Recv(buf, source=source, **kw)


def traffic(n_params: int, n_servers: int = 1, steps: int = 2, comm=None) -> dict:
    """Bytes per step that each rank **sends**, counted on real messages, in two designs on ``comm``: a
    synchronous PS (ranks < n_servers serve) and a ring allreduce over all ranks. Every rank returns
    ``{"role", "ps_bytes", "ring_bytes"}`` (bytes sent) and ``{"ps_received", "ring_received"}`` for itself."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = comm if comm is not None else MPI.COMM_WORLD
    comm = comm.Dup()
    servers, workers = _split(comm, n_servers)
    r = comm.Get_rank()
    shards = shard_bounds(n_params, n_servers)
    if r in servers:
        a, b = shards[r]
        cnt = {"sent": 0, "received": 0}
        serve(comm, np.zeros(b - a), workers, steps, lr=0.0, counter=cnt)
        ps, ps_in = cnt["sent"] / steps, cnt["received"] / steps
    else:
        cc = CountingComm(comm)
        params = np.zeros(n_params)
        for _ in range(steps):
            push_pull(cc, np.zeros(n_params), params, shards)
        ps, ps_in = cc.sent / steps, cc.received / steps
    cc = CountingComm(comm)
    buf = np.zeros(n_params)
    for _ in range(steps):
        ring_allreduce(buf, cc)
    comm.Free()
    return {"role": "server" if r in servers else "worker", "ps_bytes": ps, "ring_bytes": cc.sent / steps,
            "ps_received": ps_in, "ring_received": cc.received / steps}


def traffic_model(n_params: int, n_ranks: int, n_servers: int = 1, bytes_per_param: int = 8) -> dict:
    """Bytes each process sends per step, predicted for one server (its shard to each of the ``W`` workers:
    ``W P / S``), one worker (its gradient: ``P``) and one ring-allreduce rank (``N-1`` chunks of ``P/N`` in the
    reduce-scatter and as many in the allgather: ``2 (N-1)/N P``). Each receives as many bytes as it sends."""
    P, W, N = n_params * bytes_per_param, n_ranks - n_servers, n_ranks
    return {"server": W * P / n_servers, "worker": P, "ring": 2 * (N - 1) / N * P}


def plot_traffic(rows: list[dict], n_params: int, n_servers: int = 1, ax=None):
    """Measured bytes per step (markers) against the model (lines), by number of ranks."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    ns = [r["n_ranks"] for r in rows]
    grid = range(min(ns), max(ns) + 1)
    for key, label, colour in (("server", "PS server", "C3"), ("ring", "allreduce rank (ring)", "C0"),
                               ("worker", "PS worker", "C2")):
        ax.plot(list(grid), [traffic_model(n_params, n, n_servers)[key] / 1e3 for n in grid], "-", color=colour,
                lw=1, label=f"{label}, model")
        ax.plot(ns, [r[key] / 1e3 for r in rows], "o", color=colour, label=f"{label}, measured")
    ax.set_xlabel("ranks (PS: 1 server + workers)")
    ax.set_ylabel("kB sent per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def traffic_on(n_ranks: int, n_params: int, n_servers: int = 1) -> dict | None:
    """:func:`traffic` on the first ``n_ranks`` ranks, summarised: ``{"n_ranks", "server", "worker", "ring"}``
    (the largest count of bytes sent per step of each role), and ``{"server_received", "worker_received",
    "ring_received"}`` (the same for bytes received); None on ranks left out. Collective over the world."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm, _ = dist.subgroup(n_ranks)
    res = traffic(n_params, n_servers, comm=comm) if comm is not None else None
    allres = MPI.COMM_WORLD.allgather(res)
    if comm is None:
        return None
    got = [x for x in allres if x]
    return {"n_ranks": n_ranks,
            "server": max(x["ps_bytes"] for x in got if x["role"] == "server"),
            "worker": max(x["ps_bytes"] for x in got if x["role"] == "worker"),
            "ring": max(x["ring_bytes"] for x in got),
            "server_received": max(x["ps_received"] for x in got if x["role"] == "server"),
            "worker_received": max(x["ps_received"] for x in got if x["role"] == "worker"),
            "ring_received": max(x["ring_received"] for x in got)}


def train_local_sgd(period: int, steps: int = 40, global_batch: int = 24, lr: float = 0.1, comm=None,
                    **problem) -> dict:
    """Local SGD on every rank of ``comm``: each rank steps on its own share of each global batch and the
    parameters are averaged (one allreduce) every ``period`` steps. ``period = 1`` is synchronous data
    parallelism. Returns ``{"losses"}`` (training-set loss of the averaged model after each averaging),
    ``{"at"}`` (the steps of those averagings) and ``{"bytes_per_step"}``: the bytes each rank would send per
    step if the averaging were a ring allreduce (``2 (N-1)/N P`` per averaging, as :func:`traffic_model`
    counts; the run itself calls ``MPI_Allreduce``, whose algorithm MPI picks)."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    if period < 1:
        raise ValueError(f"period must be >= 1 step, got {period}")
    comm = comm if comm is not None else MPI.COMM_WORLD
    prob = Problem(**problem)
    p = prob.get()
    r, n = comm.Get_rank(), comm.Get_size()
    losses, at, averagings = [], [], 0
    for step in range(steps):
        g, _ = prob.grad(p, prob.batch(step, global_batch, r, n))
        p = p - lr * g
        if (step + 1) % period == 0 or step == steps - 1:
            comm.Allreduce(MPI.IN_PLACE, p, op=MPI.SUM)
            p /= n
            averagings += 1
            losses.append(prob.loss(p))
            at.append(step + 1)
    nbytes = traffic_model(p.size, n, bytes_per_param=p.itemsize)["ring"] * averagings / steps   # sent per rank
    return {"losses": losses, "at": at, "bytes_per_step": nbytes, "params": p}


def plot_losses(curves: dict, xlabel: str = "step", ax=None, title: str = ""):
    """Loss curves ``{label: (steps, losses)}`` on one axis."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    for label, (x, y) in curves.items():
        ax.plot(x, y, "-", lw=1.2, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return ax
