"""Notebooks 07 (communication runtimes: gloo against MPI on CPU ranks, bus bandwidth) and 08 (the node and the
network: hierarchical allreduce).

Every ``measure_*`` / ``*_check`` function runs on **every rank** (``cluster.run(fn, ...)`` or ``mpiexec``).

* :func:`compare_gloo_mpi`: the same float32 allreduce through ``torch.distributed`` (gloo: TCP, even on one
  host) and through mpi4py (MPICH: shared memory on one host), sizes interleaved, slowest rank's median;
  :func:`fit_both` fits each with the alpha-beta model of :func:`ddlcourse.collectives.fit_alpha_beta`;
* :func:`host_comms` and :func:`hierarchical_allreduce`: an intra-host reduce, an allreduce among one leader
  per host, and an intra-host broadcast, on MPI sub-communicators split by host (``COMM_TYPE_SHARED``) or by
  ``rank // ranks_per_host`` to emulate several hosts on one machine; :func:`hierarchical_check` compares it
  with the flat ``MPI_Allreduce``;
* :func:`hierarchy_model` and :func:`hierarchy_terms`: for nodes of 8 GPUs with one network adapter per GPU, a
  flat ring run as NCCL runs it (one ring channel per adapter) against the two hierarchical schemes, with
  :mod:`ddlcourse.perfmodel`'s alpha-beta links and :mod:`ddlcourse.hardware`'s per-direction bandwidths;
* :func:`bus_bandwidth_factor`: nccl-tests' bus bandwidth = algorithm bandwidth x factor.
"""
from __future__ import annotations

import time

import numpy as np

from ddlcourse import collectives, dist, grid, hardware
from ddlcourse.parallel.mpi_hook import comm_for
from ddlcourse.perfmodel import GB, Link, ring_allreduce_time

# What each runtime is, where it runs, who uses it in this course (printed as a table in the notebook).
RUNTIMES = [
    ("MPI", "message-passing standard; libraries: MPICH, Open MPI, MVAPICH2, Intel MPI, Cray MPICH",
     "CPU everywhere; GPU buffers with a CUDA-aware build", "mpi4py, Horovod (CPU ops here)"),
    ("NCCL", "NVIDIA's collective library: rings and trees over NVLink, PCIe, InfiniBand/RoCE",
     "NVIDIA GPUs only", "torch.distributed 'nccl', Horovod GPU ops"),
    ("Gloo", "Meta's collective library over TCP (and ibverbs)", "CPU (TCP), any host",
     "torch.distributed 'gloo' (the CPU backend here), Horovod's launcher"),
    ("gRPC", "Google's remote-procedure-call framework over HTTP/2", "any host; tensors are serialised",
     "TensorFlow's distributed runtime (parameter servers); torch RPC uses TensorPipe, same idea"),
]


def _max(comm):
    from mpi4py import MPI
    return MPI.MAX


def _median_slowest(times, comm) -> float:
    return comm.allreduce(float(np.median(times)), op=_max(comm))


# --------------------------------------------------------------------------- gloo against MPI
def compare_gloo_mpi(sizes_bytes, reps: int = 10, warmup: int = 2, group=None) -> dict:
    """Seconds per float32 allreduce through gloo (``torch.distributed``) and MPI, for each size.

    Both ways use the same buffer and run back to back for each repetition (interleaved), so a load spike on
    this shared machine hits both alike. Returns ``{"sizes", "gloo", "mpi", "world_size"}`` (slowest rank's
    median per size) on the ranks of ``group`` (None: the world), None on the others.
    """
    import torch
    import torch.distributed as tdist
    from mpi4py import MPI

    dist.init()
    if group is not None and tdist.get_rank(group) < 0:
        return None
    comm = comm_for(group)
    if comm is None:
        raise RuntimeError("MPI cannot serve this group here (see ddlcourse.grid.mpi_usable)")
    out = {"sizes": [int(s) for s in sizes_bytes], "gloo": [], "mpi": [], "world_size": comm.Get_size()}
    for nbytes in out["sizes"]:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)          # CPU: this is about CPU ranks
        arr = t.numpy()                                                    # the same memory, for mpi4py
        times = {"gloo": [], "mpi": []}
        for i in range(warmup + reps):
            for way in ("gloo", "mpi"):
                comm.Barrier()
                t0 = time.perf_counter()
                if way == "gloo":
                    tdist.all_reduce(t, group=group)
                else:
                    comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times[way].append(dt)
                t.fill_(1.0)
        for way in ("gloo", "mpi"):
            out[way].append(_median_slowest(times[way], comm))
    return out


def fit_both(res: dict) -> dict:
    """``{way: (alpha seconds, beta seconds/byte)}`` of ``T = alpha + beta n`` for gloo and MPI."""
    return {w: collectives.fit_alpha_beta(res["sizes"], res[w]) for w in ("gloo", "mpi")}


def format_fit(fit: dict) -> str:
    lines = []
    for w, (a, b) in fit.items():
        bw = f"{1 / b / GB:.2f} GB/s" if b > 0 else "(no slope)"
        lines.append(f"{w:>5}: alpha = {a * 1e6:8.1f} µs   1/beta = {bw}")
    return "\n".join(lines)


def plot_gloo_mpi(res: dict, fit: dict | None = None):
    """Time and bus bandwidth against message size, gloo beside MPI, with the fitted lines."""
    return collectives.plot_sweep(res["sizes"], {"gloo": res["gloo"], "mpi": res["mpi"]}, res["world_size"],
                                  fit=fit)


# --------------------------------------------------------------------------- hierarchical allreduce
def host_comms(comm=None, ranks_per_host: int | None = None):
    """``(local, leaders)``: the ranks of this host, and one leader (local rank 0) per host.

    ``ranks_per_host=None`` groups the ranks by real host (``Split_type(COMM_TYPE_SHARED)``: ranks that can
    share memory); an integer ``k`` pretends ranks ``0..k-1`` of ``comm`` are one host, ``k..2k-1`` the next, and
    so on (the last host may have fewer), so two "hosts" fit on a laptop. Each host's ranks and the leaders (the
    first rank of each host) are rank lines whose communicators :func:`ddlcourse.grid.comm_of` makes once and
    caches (freed by ``dist.shutdown``). ``leaders`` is ``MPI.COMM_NULL`` on ranks that are not leaders.
    Collective over ``comm``.
    """
    from mpi4py import MPI

    comm = collectives._comm(comm)
    r, n = comm.Get_rank(), comm.Get_size()
    if ranks_per_host is None:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=r)      # only to learn who shares this host
        host = node.allgather(r)
        node.Free()
    else:
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
        host = [q for q in range(n) if q // ranks_per_host == r // ranks_per_host]
    leaders = sorted(set(comm.allgather(host[0])))
    world = comm.allgather(MPI.COMM_WORLD.Get_rank())            # the grid numbers ranks as COMM_WORLD does
    local = grid.comm_of([world[q] for q in host])
    lead = grid.comm_of([world[q] for q in leaders]) if r in leaders else MPI.COMM_NULL
    return local, lead


def hierarchical_allreduce(buf: np.ndarray, local, leaders) -> np.ndarray:
    """Sum ``buf`` over all ranks in place: reduce to each host's leader, allreduce among the leaders, then
    broadcast from the leader inside each host. Returns ``buf``."""
    from mpi4py import MPI

    if local.Get_rank() == 0:
        local.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)      # 1. the host's sum lands on its leader
        if leaders != MPI.COMM_NULL:
            leaders.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)     # 2. leaders add up the hosts' sums
    else:
        local.Reduce(buf, None, op=MPI.SUM, root=0)
    local.Bcast(buf, root=0)                                     # 3. the leader hands the total to its host
    return buf


def hierarchical_check(ranks_per_host: int | None = None, nelem: int = 1000, seed: int = 0, comm=None,
                       allreduce=None) -> dict:
    """Max |hierarchical - flat MPI_Allreduce| over all ranks, and the split used. ``allreduce``: the function to
    check (default :func:`hierarchical_allreduce`), called as ``allreduce(buf, local, leaders)``."""
    from mpi4py import MPI

    comm = collectives._comm(comm)
    fn = allreduce or hierarchical_allreduce
    local, leaders = host_comms(comm, ranks_per_host)
    g = np.random.default_rng(seed + 1000 * comm.Get_rank())
    x = g.standard_normal(nelem)
    flat = x.copy()
    comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    mine = fn(x.copy(), local, leaders)
    err = float(np.abs(np.asarray(mine) - flat).max())
    hosts = comm.allreduce(1 if local.Get_rank() == 0 else 0)
    local_size = local.Get_size()
    return {"max_diff": comm.allreduce(err, op=MPI.MAX), "hosts": hosts, "ranks_on_my_host": local_size}


def time_hierarchical(nbytes: int, ranks_per_host: int | None, reps: int = 10, warmup: int = 2, comm=None) -> dict:
    """Median seconds (slowest rank) of the flat ``MPI_Allreduce`` and the hierarchical one, interleaved."""
    from mpi4py import MPI

    comm = collectives._comm(comm)
    local, leaders = host_comms(comm, ranks_per_host)
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    times = {"flat": [], "hierarchical": []}
    for i in range(warmup + reps):
        for way in times:
            comm.Barrier()
            t0 = time.perf_counter()
            if way == "flat":
                comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            else:
                hierarchical_allreduce(buf, local, leaders)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times[way].append(dt)
            buf.fill(1.0)
    return {w: _median_slowest(t, comm) for w, t in times.items()}


# --------------------------------------------------------------------------- the model for nodes of 8 GPUs
# Per-direction bandwidths from ddlcourse.hardware (its sources: the NVIDIA H100 datasheet quotes NVLink as
# 900 GB/s for both directions together, 450 GB/s each way; a DGX H100 has one 400 Gb/s ConnectX-7 adapter
# per GPU, 50 GB/s each way). The latencies (alpha) are assumptions of the same kind as ddlcourse.perfmodel's
# (NCCL/MPI over NVLink ~10 us, over InfiniBand ~5 us), not measurements.
H100_NVLINK = Link(alpha=10e-6, bandwidth=hardware.GPUS["H100-SXM"].nvlink)
NDR_PER_GPU = Link(alpha=5e-6, bandwidth=hardware.LINKS["NDR IB"].per_direction)

SCHEMES = ("flat ring", "reduce / allreduce / bcast", "reduce-scatter / allreduce / allgather")


def hierarchy_terms(nbytes: float, nodes: int, gpus_per_node: int = 8) -> dict:
    """What each scheme of :func:`hierarchy_model` pays, without the link figures: per scheme
    ``{"network_steps", "nvlink_steps", "adapters_per_node", "adapter_bytes"}``.

    ``network_steps``: steps in sequence that wait for a hop between nodes (each pays a network alpha);
    ``nvlink_steps``: steps in sequence inside the node only; ``adapters_per_node``: the network adapters of a
    node that carry traffic; ``adapter_bytes``: what each of them sends per allreduce (the bandwidth term is
    ``adapter_bytes x beta``). On one node there is no network: the steps are all NVLink steps.
    """
    g, m = gpus_per_node, nodes
    if g < 1 or m < 1:
        raise ValueError(f"need nodes >= 1 and gpus_per_node >= 1, got {nodes} and {gpus_per_node}")
    p, n = g * m, float(nbytes)
    net = m > 1
    return {
        # g ring channels over all p GPUs, channel c leaving each node through adapter c (one per "rail")
        "flat ring": dict(network_steps=2 * (p - 1) if net else 0, nvlink_steps=0 if net else 2 * (g - 1),
                          adapters_per_node=g if net else 0, adapter_bytes=2 * (p - 1) / p * n / g if net else 0.0),
        "reduce / allreduce / bcast": dict(network_steps=2 * (m - 1), nvlink_steps=4 * (g - 1),
                                           adapters_per_node=1 if net else 0, adapter_bytes=2 * (m - 1) / m * n),
        "reduce-scatter / allreduce / allgather": dict(network_steps=2 * (m - 1), nvlink_steps=2 * (g - 1),
                                                       adapters_per_node=g if net else 0,
                                                       adapter_bytes=2 * (m - 1) / m * n / g),
    }


def hierarchy_model(nbytes: float, nodes: int, gpus_per_node: int = 8, intra: Link = H100_NVLINK,
                    nic: Link = NDR_PER_GPU) -> dict:
    """Seconds of one allreduce of ``nbytes`` over ``nodes`` x ``gpus_per_node`` GPUs, three ways.

    * ``flat ring``: a ring over every GPU, run as NCCL runs it on a node with one network adapter per GPU
      ("rails"): ``g`` ring channels, each carrying ``1/g`` of the message and leaving each node through its
      own adapter. Each of the ``2(p-1)`` steps moves a chunk of ``n/(g p)`` per channel and lasts as long as
      its slowest hop: the network hop (``alpha_net + n/(g p) beta_net``) or a GPU's NVLink, which carries the
      chunks of the ``g-1`` channels that stay in the node (``alpha_nvl + (g-1) n/(g p) beta_nvl``). Every
      adapter sends ``2 (p-1)/p n/g`` bytes: all ``g`` adapters of a node share the message;
    * ``reduce / allreduce / bcast``: notebook 08's exercise; a reduce and a broadcast inside the node (each
      costed as a reduce-scatter plus a gather: ``2 (g-1) (alpha + n/g beta)``), and a ring over the node
      leaders whose whole message goes through the leader's one adapter: ``2 (m-1)/m n`` bytes, ``g`` times
      the others' per adapter. This is the scheme that loses bandwidth;
    * ``reduce-scatter / allreduce / allgather``: each GPU of a node owns 1/g of the message and all-reduces it
      with its counterparts on the other nodes over its own adapter (Horovod's hierarchical allreduce,
      ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``). Its adapters send ``2 (m-1)/m n/g`` bytes each: the flat ring's
      bandwidth term to within a factor ``m/(m-1)``. It wins by latency: ``2(m-1)`` network steps and
      ``2(g-1)`` NVLink steps against the flat ring's ``2(gm-1)``.

    The phases of the two hierarchical schemes run one after the other (no pipelining between them).
    """
    g, m = gpus_per_node, nodes
    hierarchy_terms(nbytes, nodes, gpus_per_node)          # validates the arguments
    p = g * m
    intra_rs = 0.0 if g == 1 else (g - 1) * (intra.alpha + nbytes / g * intra.beta)   # one reduce-scatter
    if m > 1:
        chunk = nbytes / (g * p)                             # per channel and step
        step = max(nic.alpha + chunk * nic.beta, (intra.alpha + (g - 1) * chunk * intra.beta) if g > 1 else 0.0)
        flat = 2 * (p - 1) * step
    else:
        flat = ring_allreduce_time(nbytes, g, intra)
    leaders = 4 * intra_rs + ring_allreduce_time(nbytes, m, nic)
    rs = 2 * intra_rs + ring_allreduce_time(nbytes / g, m, nic)
    return dict(zip(SCHEMES, (flat, leaders, rs)))


def plot_hierarchy_model(nbytes: float, nodes_list, gpus_per_node: int = 8, sizes=None, nodes_for_sizes: int = 16):
    """Modelled time of one allreduce: left, of ``nbytes`` against the number of nodes; right, on
    ``nodes_for_sizes`` nodes against the message size (``sizes`` in bytes, default 64 kB to 4 GB)."""
    import matplotlib.pyplot as plt

    sizes = list(sizes) if sizes is not None else [2.0 ** k for k in range(16, 33)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    rows = [hierarchy_model(nbytes, m, gpus_per_node) for m in nodes_list]
    for way in SCHEMES:
        ax1.plot(nodes_list, [r[way] * 1e3 for r in rows], "o-", ms=3, label=way)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(f"nodes ({gpus_per_node} GPUs each)")
    ax1.set_ylabel("ms per allreduce (model)")
    ax1.set_title(f"{nbytes / 1e6:.0f} MB of gradients", fontsize=9)
    rows = [hierarchy_model(n, nodes_for_sizes, gpus_per_node) for n in sizes]
    flat = [r["flat ring"] for r in rows]
    for way in SCHEMES:
        ax2.plot(sizes, [r[way] / f for r, f in zip(rows, flat)], "-", label=way)
    ax2.set_xscale("log")
    ax2.set_xlabel("message size (bytes)")
    ax2.set_ylabel("time / flat ring's time (model)")
    ax2.set_title(f"{nodes_for_sizes} nodes x {gpus_per_node} GPUs", fontsize=9)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- bus bandwidth
BUS_FACTORS = {  # nccl-tests, doc/PERFORMANCE.md: busbw = algbw x factor, for n ranks
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """The factor that turns algorithm bandwidth (bytes / time) into bus bandwidth, per nccl-tests."""
    if collective not in BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(BUS_FACTORS)}")
    if n < 1:
        raise ValueError(f"n must be >= 1 ranks, got {n}")
    return BUS_FACTORS[collective](n)


def bandwidths_at(nbytes: int, reps: int = 5, comm=None) -> dict:
    """Algorithm and bus bandwidth (bytes/s) of ``MPI_Allreduce`` and the hand-written ring at ``nbytes``,
    interleaved (slowest rank's median); runs on every rank of ``comm``."""
    comm = collectives._comm(comm)
    n = comm.Get_size()
    buf = np.ones(max(1, nbytes // 4), dtype=np.float32)
    times = {"ring": [], "mpi": []}
    for i in range(reps + 1):
        for way in times:
            comm.Barrier()
            t0 = time.perf_counter()
            collectives.ALGORITHMS[way](buf, comm)
            dt = time.perf_counter() - t0
            if i:
                times[way].append(dt)
            buf.fill(1.0)
    out = {}
    for way, ts in times.items():
        t = _median_slowest(ts, comm)
        algbw = buf.nbytes / t
        out[way] = {"seconds": t, "algbw": algbw, "busbw": algbw * bus_bandwidth_factor("all_reduce", n)}
    return out
