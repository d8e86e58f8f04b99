"""Notebook 09 · the parameter server: servers hold the parameters, workers pull them and push gradients.

The architecture of DistBelief (Dean et al. 2012) and of TensorFlow 1's ``ClusterSpec`` with ``ps`` and
``worker`` tasks, built here on mpi4py point-to-point messages (TensorFlow sends the same tensors over gRPC):

* ranks ``0 .. n_servers-1`` are **servers**; server ``s`` holds shard ``s`` of the flat parameter vector
  (:func:`shard_bounds`); the other ranks are **workers**;
* a worker computes the gradient of its share of the global batch, **pushes** each gradient shard to its
  server and **pulls** the updated shard back (:func:`push_pull`);
* a **synchronous** server (:func:`serve`) waits for every worker's gradient, averages, takes one SGD step and
  sends the new shard to everyone: the same step as allreduce data parallelism and as serial SGD on the global
  batch (:func:`compare_sync`); an **asynchronous** server applies each gradient as it arrives and answers that
  worker at once, so gradients are computed on parameters that are already *stale* (:func:`train_async`
  measures the staleness; :func:`train_stale` emulates a fixed staleness deterministically in one process);
* :func:`traffic` counts the bytes, always as **the bytes a process sends per step** (the convention of
  nccl-tests' bus bandwidth; what a process receives is the same amount in each design here): a server sends
  ``W P / S`` per step for ``W`` workers, a worker ``P``, a ring-allreduce rank ``2 (N-1)/N P`` whatever ``N`` is;
* :func:`train_local_sgd`: no server; workers take ``H`` local steps, then average the parameters (H = 1 is
  synchronous data parallelism).

The model's parameters live on the rank's device (``dist.init().device``); what travels is a flat float64
host copy (mpi4py sends host memory), as in :mod:`ddlcourse.collectives`.
"""
from __future__ import annotations

import numpy as np


GRAD, PARAM = 11, 12           # message tags


# --------------------------------------------------------------------------- the problem: a small MLP, flat


def shard_bounds(n_params: int, n_servers: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of each server's shard: ``n_params`` split as evenly as possible."""
    if n_servers < 1:
        raise ValueError(f"need at least one server, got {n_servers}")
    edges = np.linspace(0, n_params, n_servers + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


# --------------------------------------------------------------------------- the two sides
def push_pull(comm, grad: np.ndarray, params: np.ndarray, shards: list[tuple[int, int]]) -> np.ndarray:
    """The worker's side of one step: push each gradient shard to its server (server ``s`` is rank ``s`` and
    owns ``grad[start:stop]``), then pull the updated shard into ``params``. Returns ``params``."""
    for s, (a, b) in enumerate(shards):
        comm.Send(np.ascontiguousarray(grad[a:b]), dest=s, tag=GRAD)        # push
    for s, (a, b) in enumerate(shards):
        comm.Recv(params[a:b], source=s, tag=PARAM)                          # pull
    return params


def send_params(comm, shard: np.ndarray, workers) -> None:
    """A server sends its shard to each of ``workers`` (the initial pull, and each step's answer)."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    reqs = [comm.Isend(shard, dest=w, tag=PARAM) for w in workers]
    MPI.Request.Waitall(reqs)


def serve(comm, shard: np.ndarray, workers, steps: int, lr: float, sync: bool = True, counter=None) -> dict:
    """The server's loop over ``steps`` rounds. ``shard`` (this server's parameters) is updated in place.

    ``sync=True``: each round, receive one gradient from every worker (in any order), average them, take one
    SGD step, and send the new shard to all workers. ``sync=False``: apply each gradient as it arrives
    (``lr / len(workers)`` per gradient, the same total step size) and answer that worker alone; a gradient's
    *staleness* is the number of updates applied since its worker last received the parameters.

    Every worker's next gradient has its own posted receive (``Irecv`` from that worker, then ``Waitall`` or
    ``Waitany``), not one receive from ``MPI.ANY_SOURCE``. MPICH posts an any-source receive on shared memory
    and on the network at once, a path with a history of hangs (pmodels/mpich#4221, #6027, #7217); a two-node
    rehearsal of notebook 09, with one worker beside the server and two on the other node, once hung in
    ``train_async`` while the server received that way.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    workers = list(workers)
    W = len(workers)
    grads = [np.empty_like(shard) for _ in workers]
    left = [steps] * W                      # gradients each worker has still to send
    reqs = [comm.Irecv(grads[i], source=w, tag=GRAD) for i, w in enumerate(workers)] if steps else []
    version, sent_at, staleness = 0, {w: 0 for w in workers}, []
    count = counter if counter is not None else {"sent": 0, "received": 0}

    def take(i: int) -> np.ndarray:
        """Worker ``i``'s gradient has arrived: count it and post the receive of its next one."""
        left[i] -= 1
        count["received"] += grads[i].nbytes
        g = grads[i].copy()
        if left[i]:
            reqs[i] = comm.Irecv(grads[i], source=workers[i], tag=GRAD)
        return g

    for _ in range(steps):
        if sync:
            MPI.Request.Waitall(reqs)
            total = np.zeros_like(shard)
            for i in range(W):
                total += take(i)
            shard -= lr * total / W
            version += 1
            send_params(comm, shard, workers)
            count["sent"] += W * shard.nbytes
        else:
            for _ in range(W):
                i = MPI.Request.Waitany(reqs)
                w = workers[i]
                g = take(i)
                staleness.append(version - sent_at[w])
                shard -= lr / W * g
                version += 1
                comm.Send(shard, dest=w, tag=PARAM)
                sent_at[w] = version
                count["sent"] += shard.nbytes
    return {"staleness": staleness, **count}


# --------------------------------------------------------------------------- training runs


# --------------------------------------------------------------------------- traffic


# --------------------------------------------------------------------------- local SGD

