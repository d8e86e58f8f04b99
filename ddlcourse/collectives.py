"""Collectives from scratch on mpi4py NumPy buffers, and how to measure and model their cost.

Every function here runs on **every rank** (an ipyparallel engine, or a process under ``mpiexec``):
call it with ``cluster.run(fn, ...)`` or ``%px``. ``comm`` defaults to ``MPI.COMM_WORLD``.

* point to point: :func:`ring_pass` (each rank sends to its right neighbour), :func:`ping_pong`
* the standard collectives in one look: :func:`collectives_tour`
* allreduce written by hand, checked against ``MPI.Allreduce``:

  - :func:`ring_allreduce`  -- reduce-scatter then allgather around a ring (Patarasuk & Yuan 2009;
    the algorithm behind Baidu's allreduce, Horovod and NCCL's ring);
  - :func:`recursive_doubling_allreduce` -- log2(N) rounds of pairwise exchange (Thakur et al. 2005);
  - :func:`reduce_bcast_allreduce` -- the naive reduce to rank 0, then broadcast.

* the alpha-beta (latency-bandwidth) model, T(n bytes) = alpha + beta * n: :func:`model_time`,
  :func:`fit_alpha_beta`; measuring: :func:`time_allreduce`, :func:`sweep`, :func:`bandwidth`;
  plots: :func:`plot_sweep`; the learner's own allreduce next to MPI's: :func:`time_mine_vs_mpi`.
* why bucketing / tensor fusion pays: :func:`fusion_demo`.

The four allreduce functions take a NumPy array or a torch tensor on any device (CPU or GPU): see
:func:`_host_buffer`.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import torch

from ddlcourse import dist


def _comm(comm=None):
    if comm is None:
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
        return MPI.COMM_WORLD
    return comm


# --------------------------------------------------------------------------- point to point
def ring_pass(comm=None) -> dict:
    """Each rank sends its rank to the right neighbour and receives from the left one.

    ``Sendrecv`` does both at once: a plain blocking ``Send`` on every rank could deadlock when
    messages are too big to be buffered, because every rank would wait for a receive first.
    """
    comm = _comm(comm)
    r, n = comm.Get_rank(), comm.Get_size()
    right, left = (r + 1) % n, (r - 1) % n
    out = np.array([r], dtype=np.int64)
    got = np.empty(1, dtype=np.int64)
    comm.Sendrecv(out, dest=right, recvbuf=got, source=left)
    return {"rank": r, "sent_to": right, "received_from": left, "value": int(got[0])}


def ping_pong(nbytes: int, reps: int = 20, comm=None) -> float | None:
    """Half the round-trip time (seconds) of ``nbytes`` between ranks 0 and 1; None on other ranks."""
    comm = _comm(comm)
    r = comm.Get_rank()
    if comm.Get_size() < 2:
        raise ValueError("ping_pong needs at least 2 ranks")
    buf = np.zeros(max(1, nbytes), dtype=np.uint8)
    comm.Barrier()
    if r > 1:
        return None
    other = 1 - r
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        if r == 0:
            comm.Send(buf, dest=other)
            comm.Recv(buf, source=other)
        else:
            comm.Recv(buf, source=other)
            comm.Send(buf, dest=other)
        times.append((time.perf_counter() - t0) / 2)
    return float(np.median(times[2:]))


# --------------------------------------------------------------------------- the standard collectives
def collectives_tour(comm=None) -> dict:
    """Broadcast, reduce, allgather and allreduce of small arrays; rank r contributes ``r + 1``."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = _comm(comm)
    r = comm.Get_rank()
    mine = np.full(2, r + 1.0)

    b = mine.copy() if r == 0 else np.empty(2)
    comm.Bcast(b, root=0)                                  # rank 0's data everywhere

    red = np.empty(2) if r == 0 else None
    comm.Reduce(mine, red, op=MPI.SUM, root=0)             # sum lands on rank 0 only

    gath = np.empty((comm.Get_size(), 2))
    comm.Allgather(mine, gath)                             # every rank gets every contribution

    allr = np.empty(2)
    comm.Allreduce(mine, allr, op=MPI.SUM)                 # the sum, on every rank
    return {"rank": r, "bcast": b.tolist(), "reduce": None if red is None else red.tolist(),
            "allgather": gath[:, 0].tolist(), "allreduce": allr.tolist()}


# --------------------------------------------------------------------------- allreduce by hand
def _host_buffer(allreduce):
    """Let an allreduce written on NumPy buffers take a torch tensor on any device, too.

    mpi4py sends host memory: a GPU buffer would need a CUDA-aware MPI, which the course does not assume. So a
    CUDA tensor is copied to the CPU, reduced there and copied back (the copies cost two trips over PCIe; NCCL
    through ``torch.distributed`` avoids them). A contiguous CPU tensor is reduced in place through a NumPy view.
    """
    @functools.wraps(allreduce)
    def wrapper(buf, comm=None):
        if isinstance(buf, np.ndarray):
            return allreduce(buf, comm)

        if not torch.is_tensor(buf):
            raise TypeError(f"{allreduce.__name__} needs a NumPy array or a torch tensor, got {type(buf).__name__}")
        with torch.no_grad():
            host = buf.detach().cpu().contiguous()         # a view of a contiguous CPU tensor, else a copy
            allreduce(host.numpy(), comm)
            if host.device != buf.device or host.data_ptr() != buf.data_ptr():
                buf.copy_(host)                            # back to the device (or into the strided original)
        return buf
    return wrapper


def ring_reduce_scatter(chunks: list, comm=None) -> list:
    """The first half of the ring allreduce, in place on ``chunks`` (N NumPy arrays, this rank's copy).

    At step s (0 .. N-2) rank r sends chunk (r - s) mod N to its right neighbour and adds the chunk
    (r - s - 1) mod N received from its left one. Afterwards rank r holds the sum over all ranks of chunk
    (r + 1) mod N; the other chunks hold partial sums. Returns ``chunks``.
    """
    comm = _comm(comm)
    r, n = comm.Get_rank(), comm.Get_size()
    if len(chunks) != n:
        raise ValueError(f"ring_reduce_scatter needs one chunk per rank ({n}), got {len(chunks)}")
    right, left = (r + 1) % n, (r - 1) % n
    tmp = np.empty(max(len(ch) for ch in chunks), dtype=chunks[0].dtype)
    for s in range(n - 1):
        send_c, recv_c = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        comm.Sendrecv(send_c, dest=right, recvbuf=tmp[:len(recv_c)], source=left)
        recv_c += tmp[:len(recv_c)]
    return chunks


@_host_buffer
def ring_allreduce(buf: np.ndarray, comm=None) -> np.ndarray:
    """Sum ``buf`` over all ranks, in place, with the ring algorithm; returns ``buf``.

    The buffer is cut into N chunks. Reduce-scatter: in N-1 steps each rank passes one chunk to its
    right neighbour, which adds it to its own copy; afterwards rank r owns the full sum of chunk
    (r + 1) % N. Allgather: N-1 more steps pass the finished chunks around the ring.
    Each rank sends 2 (N-1)/N of the buffer in total, whatever N is: that is why the ring is
    bandwidth-optimal for large messages.
    """
    comm = _comm(comm)
    r, n = comm.Get_rank(), comm.Get_size()
    if n == 1:
        return buf
    if not buf.flags.c_contiguous:
        raise ValueError("ring_allreduce needs a C-contiguous array (use np.ascontiguousarray)")
    flat = buf.reshape(-1)
    chunks = np.array_split(flat, n)                       # views into buf, sizes differ by <= 1
    right, left = (r + 1) % n, (r - 1) % n
    ring_reduce_scatter(chunks, comm)
    # allgather: at step s, pass the finished chunk (r + 1 - s) on, receive chunk (r - s)
    for s in range(n - 1):
        send_c, recv_c = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send_c, dest=right, recvbuf=recv_c, source=left)
    return buf


@_host_buffer
def recursive_doubling_allreduce(buf: np.ndarray, comm=None) -> np.ndarray:
    """Sum ``buf`` over all ranks, in place, by recursive doubling; returns ``buf``.

    In round k each rank swaps its whole buffer with the rank whose number differs in bit k and adds:
    log2(N) rounds, each carrying the full message (latency-optimal, good for small messages).
    When N is not a power of two, the ranks beyond the largest power of two first hand their data
    to a partner and get the result back at the end.
    """
    comm = _comm(comm)
    r, n = comm.Get_rank(), comm.Get_size()
    if n == 1:
        return buf
    p2 = 1 << (n.bit_length() - 1)                         # largest power of two <= n
    tmp = np.empty_like(buf)
    if r >= p2:                                            # an extra rank: fold in, wait for the result
        comm.Send(buf, dest=r - p2)
        comm.Recv(buf, source=r - p2)
        return buf
    if r + p2 < n:
        comm.Recv(tmp, source=r + p2)
        buf += tmp
    mask = 1
    while mask < p2:
        partner = r ^ mask
        comm.Sendrecv(buf, dest=partner, recvbuf=tmp, source=partner)
        buf += tmp
        mask <<= 1
    if r + p2 < n:
        comm.Send(buf, dest=r + p2)
    return buf


@_host_buffer
def reduce_bcast_allreduce(buf: np.ndarray, comm=None) -> np.ndarray:
    """The naive allreduce: ``Reduce`` to rank 0, then ``Bcast``; rank 0's link carries everything."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = _comm(comm)
    out = np.empty_like(buf)
    comm.Reduce(buf, out, op=MPI.SUM, root=0)
    if comm.Get_rank() == 0:
        buf[...] = out
    comm.Bcast(buf, root=0)
    return buf


@_host_buffer
def mpi_allreduce(buf: np.ndarray, comm=None) -> np.ndarray:
    """The library's ``MPI.Allreduce`` (in place), the reference the others are measured against."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    _comm(comm).Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


ALGORITHMS = {
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "reduce_bcast": reduce_bcast_allreduce,
    "mpi": mpi_allreduce,
}


def _get(algorithm: str):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm]


def check_against_mpi(algorithm: str, nelem: int = 1000, dtype=np.float64, seed: int = 0, comm=None) -> float:
    """Max abs difference between ``algorithm`` and ``MPI.Allreduce`` on random data (same on every rank)."""
    comm = _comm(comm)
    g = np.random.default_rng(seed + 1000 * comm.Get_rank())
    x = g.standard_normal(nelem).astype(dtype)
    ref = mpi_allreduce(x.copy(), comm)
    mine = _get(algorithm)(x.copy(), comm)
    return comm.allreduce(float(np.abs(mine - ref).max()) if nelem else 0.0, op=_max_op())


def _max_op():
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    return MPI.MAX


# --------------------------------------------------------------------------- measuring
def time_allreduce(algorithm: str, nbytes: int, reps: int = 10, warmup: int = 2, comm=None) -> float:
    """Median seconds of one allreduce of ``nbytes`` (float32), taken as the slowest rank's time."""
    comm = _comm(comm)
    fn = _get(algorithm)
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    times = []
    for i in range(warmup + reps):
        comm.Barrier()                                     # start together, so we time the collective
        t0 = time.perf_counter()
        fn(buf, comm)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        buf.fill(1.0)                                      # keep the values from overflowing
    return comm.allreduce(float(np.median(times)), op=_max_op())


def sweep(sizes_bytes, algorithms=("ring", "mpi"), reps: int = 10, comm=None) -> dict:
    """``{algorithm: [seconds per allreduce for each size]}`` (the same on every rank)."""
    return {a: [time_allreduce(a, int(s), reps=reps, comm=comm) for s in sizes_bytes] for a in algorithms}


def bandwidth(nbytes: float, seconds: float, world_size: int, kind: str = "bus") -> float:
    """Bytes per second of an allreduce.

    ``algo``: message size / time. ``bus``: algo * 2 (N-1) / N, the rate at which each rank's link
    actually moves data in a ring; it is comparable across N (the convention of nccl-tests).
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    algo = nbytes / seconds
    if kind == "algo":
        return algo
    if kind == "bus":
        return algo * 2 * (world_size - 1) / world_size
    raise ValueError(f"kind must be 'bus' or 'algo', got {kind!r}")


# --------------------------------------------------------------------------- the alpha-beta model
def model_time(algorithm: str, nbytes, world_size: int, alpha: float, beta: float):
    """Predicted seconds of one allreduce of ``nbytes`` on ``world_size`` ranks.

    alpha: seconds per message (latency), beta: seconds per byte (1 / bandwidth). Reduction
    arithmetic is left out (it is small next to the transfer on a network).

    * ring: 2 (N-1) messages of n/N bytes        -> 2 (N-1) alpha + 2 (N-1)/N n beta
    * recursive doubling: log2 N messages of n   -> log2(N) (alpha + n beta)
    * reduce + broadcast (binomial trees)        -> 2 log2(N) (alpha + n beta)
    """
    n_ = np.asarray(nbytes, dtype=float)
    N = world_size
    lg = np.ceil(np.log2(N)) if N > 1 else 0.0
    if algorithm == "ring":
        return 2 * (N - 1) * alpha + 2 * (N - 1) / N * n_ * beta
    if algorithm in ("recursive_doubling", "mpi"):
        return lg * (alpha + n_ * beta)
    if algorithm == "reduce_bcast":
        return 2 * lg * (alpha + n_ * beta)
    raise ValueError(f"no cost model for {algorithm!r}")


def fit_alpha_beta(sizes_bytes, seconds) -> tuple[float, float]:
    """Least-squares fit of ``T = alpha + beta * n``, weighting each point by 1/T.

    Relative weights let the small messages (which fix alpha) count as much as the large ones (which
    fix beta). Returns ``(alpha seconds, beta seconds/byte)``, both clipped at 0.
    """
    n_ = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n_.shape != t.shape or n_.size < 2:
        raise ValueError("need at least two (size, time) points of the same length")
    A = np.stack([np.ones_like(n_), n_], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def plot_sweep(sizes_bytes, results: dict, world_size: int, fit: dict | None = None, axes=None):
    """Left: time per allreduce against message size (log-log), with fitted alpha-beta lines.
    Right: bus bandwidth against message size."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(8.4, 3.2))
    s = np.asarray(sizes_bytes, dtype=float)
    for name, ts in results.items():
        line, = axes[0].loglog(s, ts, "o", ms=4, label=name)
        if fit and name in fit:
            a, b = fit[name]
            axes[0].loglog(s, a + b * s, "-", color=line.get_color(), lw=1,
                           label=f"fit: α={a * 1e6:.0f} µs, 1/β={1 / b / 1e9 if b else float('inf'):.2f} GB/s")
        bw = [bandwidth(x, t, world_size) / 1e9 for x, t in zip(s, ts)]
        axes[1].semilogx(s, bw, "o-", ms=4, color=line.get_color(), label=name)
    axes[0].set_xlabel("message size (bytes)")
    axes[0].set_ylabel("seconds per allreduce")
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel("message size (bytes)")
    axes[1].set_ylabel("bus bandwidth (GB/s)")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].figure.tight_layout()
    return axes


# --------------------------------------------------------------------------- bucketing / tensor fusion
def fusion_demo(n_tensors: int, nelem: int, reps: int = 5, comm=None) -> dict:
    """Seconds to allreduce ``n_tensors`` tensors of ``nelem`` float32 each: one by one vs fused into one.

    One by one pays the latency alpha ``n_tensors`` times; fused pays it once. This is what DDP's
    gradient buckets and Horovod's tensor fusion buy.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = _comm(comm)
    tensors = [np.ones(nelem, dtype=np.float32) for _ in range(n_tensors)]

    def separate():
        for t in tensors:
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

    def fused():
        flat = np.concatenate(tensors)                     # copy in: the price of fusion
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        offs = 0
        for t in tensors:                                  # copy back out
            t[...] = flat[offs:offs + nelem]
            offs += nelem

    out = {}
    for name, fn in (("separate", separate), ("fused", fused)):
        times = []
        for i in range(reps + 1):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            if i:
                times.append(time.perf_counter() - t0)
            for t in tensors:
                t.fill(1.0)
        out[name] = comm.allreduce(float(np.median(times)), op=_max_op())
    return out


def sweep_on(n_ranks: int, sizes_bytes, algorithms=("ring", "mpi"), reps: int = 10) -> dict | None:
    """:func:`sweep` on the first ``n_ranks`` ranks of the world (None on the others). Collective."""
    comm, _ = dist.subgroup(n_ranks)
    if comm is None:
        return None
    return sweep(sizes_bytes, algorithms, reps=reps, comm=comm)


def time_mine_vs_mpi(fn, sizes_bytes, reps: int = 5, comm=None) -> dict:
    """Median seconds of the learner's allreduce ``fn(buf, comm)`` and of ``MPI.Allreduce`` at each size (float32),
    the slowest rank's. ``{"sizes": [...], "mine": [...] or None, "mpi": [...], "why": str}``: ``mine`` is None
    (and ``why`` says why) when ``fn`` is not written yet or raises at once, on every rank. Collective."""
    comm = _comm(comm)
    why = ""
    try:
        fn(np.ones(comm.Get_size() + 1, dtype=np.float32), comm)
    except NotImplementedError:
        why = "your function is not written yet"
    except Exception as e:   # noqa: BLE001 -- said in the table, not raised
        why = f"your function raised {type(e).__name__}: {e}"
    why = next((w for w in comm.allgather(why) if w), "")
    out = {"sizes": [int(s) for s in sizes_bytes], "mine": None if why else [], "mpi": [], "why": why}
    for s in out["sizes"]:
        for key, f in (("mine", fn), ("mpi", mpi_allreduce)):
            if out[key] is None:
                continue
            buf, times = np.ones(max(1, s // 4), dtype=np.float32), []
            for i in range(reps + 1):                      # one warm-up call
                comm.Barrier()
                t0 = time.perf_counter()
                f(buf, comm)
                if i:
                    times.append(time.perf_counter() - t0)
                buf.fill(1.0)
            out[key].append(comm.allreduce(float(np.median(times)), op=_max_op()))
    return out


def print_mine_vs_mpi(res: dict) -> None:
    """The table of :func:`time_mine_vs_mpi`: one row per size, your time next to MPI's (printed, not judged)."""
    if res["mine"] is None:
        print(f"{res['why']}: MPI.Allreduce only")
    print(f"{'bytes':>10} {'yours (µs)':>12} {'MPI (µs)':>10} {'ratio':>7}")
    for i, s in enumerate(res["sizes"]):
        mpi = res["mpi"][i]
        mine = res["mine"][i] if res["mine"] else None
        print(f"{s:>10} " + (f"{mine * 1e6:12.1f} " if mine else f"{'-':>12} ") + f"{mpi * 1e6:10.1f}"
              + (f" {mine / mpi:7.1f}" if mine else ""))
