"""A scaling model of data-parallel training: throughput, speedup and efficiency at N GPUs or nodes.

One training step of data parallelism on ``world_size`` devices is modelled from five things:

* **compute**: per-sample time ``t_sample`` = training FLOPs per sample / (device peak FLOP/s x ``mfu``),
  split one third forward, two thirds backward (the backward pass costs about twice the forward);
* **gradient size**: ``n_params x bytes_per_grad`` (4 for fp32, 2 for fp16 gradients);
* **an alpha-beta network**: sending ``n`` bytes over a link costs ``alpha + n * beta``
  (``beta = 1 / bandwidth``); allreduce is a ring (``2(p-1) alpha + 2 (p-1)/p n beta``) or a pipelined tree
  (``2 log2(p) alpha + 2 n beta``), and across nodes it is hierarchical: reduce-scatter inside the node,
  allreduce between nodes at the node's injection bandwidth, allgather inside the node
  (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009; NCCL's double binary trees, Jeaugey 2019);
* **bucketing and overlap**: gradients are cut into buckets (25 MB as in PyTorch DDP) that become ready
  one after another during the backward pass; each bucket's allreduce starts when it is ready and the
  previous one is done, so only what is left after the backward pass is exposed;
* **stragglers**: every step waits for the slowest of ``p`` processes. With step times that vary by a
  coefficient of variation ``jitter_cv`` (system noise, data loading), the expected slowest is
  ``1 + jitter_cv * E[max of p standard normals]`` (Blom's approximation), which grows like sqrt(2 ln p).

Pipeline stages (``num_stages``) split the model over devices: each stage has 1/S of the compute and of
the gradients, ``world_size / S`` replicas do data parallelism, and the GPipe bubble
``(S - 1) / (M + S - 1)`` with ``M`` micro-batches idles part of every step.

:data:`SYSTEMS`, :data:`WORKLOADS` and :data:`PUBLISHED` hold stated hardware parameters and the
published results the course checks the model against (:func:`validate`). The constants measured
on your own machine come from :func:`measure_allreduce`, :func:`fit_alpha_beta` and
:func:`measure_compute`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from statistics import NormalDist

# ----------------------------------------------------------------------------------------- parameters
GB = 1e9
MB = 1e6


@dataclass(frozen=True)
class Link:
    """An alpha-beta link: latency ``alpha`` (s) and ``bandwidth`` (bytes/s, one direction)."""
    alpha: float
    bandwidth: float

    @property
    def beta(self) -> float:  # seconds per byte
        return 1.0 / self.bandwidth


@dataclass(frozen=True)
class System:
    """A machine: devices per node, their peak FLOP/s, the link inside a node and each node's network link."""
    name: str
    devices_per_node: int
    peak_flops: float            # per device (GPU, or CPU process share), FLOP/s, at the precision used
    intra: Link                  # between devices of a node (NVLink, shared memory)
    inter: Link                  # one node's injection into the network (all its NICs together)
    source: str = ""


@dataclass(frozen=True)
class Workload:
    """A model and how it is trained: FLOPs and parameters per sample, batch, gradient precision."""
    name: str
    flops_per_sample: float      # forward + backward FLOPs for one sample (~3x forward)
    n_params: float
    micro_batch: int             # samples per device per step
    bytes_per_grad: int = 4      # 4: fp32 gradients, 2: fp16
    mfu: float = 0.5             # achieved fraction of peak FLOP/s in compute
    source: str = ""

    @property
    def grad_bytes(self) -> float:
        return self.n_params * self.bytes_per_grad


# ResNet-50: 25.6 M parameters (102 MB of fp32 gradients), 4.1 G multiply-adds forward per 224x224 image
# (He et al. 2016), so 3 x 2 x 4.1e9 = 24.6 GFLOP per image for forward + backward.
RESNET50 = Workload("ResNet-50", flops_per_sample=24.6e9, n_params=25.6e6, micro_batch=64,
                    source="He et al. 2016; Goyal et al. 2017")

# Hardware parameters from vendor specifications. Latencies are end-to-end software latencies of one
# message (NCCL/MPI over NVLink ~10 us, over InfiniBand ~5 us), not the wire latency.
V100_FP32 = 15.7e12   # V100 SXM2 fp32 peak (NVIDIA V100 datasheet); fp16 tensor cores: 125e12
SYSTEMS: dict[str, System] = {
    "dgx1": System("DGX-1 class node, 8 V100 SXM2, NVLink 2", 8, V100_FP32,
                   intra=Link(10e-6, 50 * GB), inter=Link(5e-6, 4 * 12.5 * GB),
                   source="NVIDIA V100 and DGX-1 datasheets: 2 NVLink bricks x 25 GB/s between GPU pairs"),
    "summit": System("Summit: 6 V100 per node, dual-rail EDR InfiniBand", 6, V100_FP32,
                     intra=Link(10e-6, 50 * GB), inter=Link(5e-6, 2 * 12.5 * GB),
                     source="OLCF Summit user guide: 6 V100, NVLink 2 (50 GB/s), 2 x EDR IB 100 Gb/s per node"),
    "lassen": System("Lassen: 4 V100 per node, dual-rail EDR InfiniBand", 4, V100_FP32,
                     intra=Link(10e-6, 75 * GB), inter=Link(5e-6, 2 * 12.5 * GB),
                     source="LLNL Lassen: 4 V100, NVLink 2 (3 bricks, 75 GB/s), 2 x EDR IB per node"),
    # Frontera: 2 x Xeon Platinum 8280 (2 x 28 cores), 4 MPI processes per node -> 14 cores each.
    # Peak per process: 14 cores x 64 fp32 FLOP/cycle (2 AVX-512 FMA units) x 2.0 GHz AVX-512 clock.
    "frontera": System("Frontera: 2 x Xeon 8280 (Cascade Lake), 4 processes per node, HDR-100 IB", 4,
                       14 * 64 * 2.0e9, intra=Link(1e-6, 10 * GB), inter=Link(5e-6, 12.5 * GB),
                       source="TACC Frontera user guide; Intel Xeon Platinum 8280 specifications"),
}


@dataclass(frozen=True)
class Published:
    """One published result and the configuration it was measured on."""
    label: str
    system: str
    workload: Workload
    world_size: int
    metric: str          # "throughput" (samples/s, all devices), "speedup" or "efficiency"
    value: float
    source: str


PUBLISHED: list[Published] = [
    Published("ResNet-50, 1 V100", "dgx1", RESNET50, 1, "throughput", 334.0,
              "MVAPICH2-GDR / Horovod TensorFlow benchmark (OSU HiDL)"),
    Published("ResNet-50, 2 V100 speedup", "dgx1", RESNET50, 2, "speedup", 1.89,
              "MVAPICH2-GDR / Horovod TensorFlow benchmark (OSU HiDL)"),
    Published("ResNet-50, 1,536 V100 on Summit", "summit", RESNET50, 1536, "throughput", 0.42e6,
              "Summit ResNet-50 reports (~4.5 min for 90 epochs); cf. Goyal et al. 2017, Kumar et al. 2019"),
    Published("ResNet-50, 2,048 Frontera nodes", "frontera", RESNET50, 2048 * 4, "throughput", 260e3,
              "Jain et al. 2019, DLS workshop at SC19 (TensorFlow + Horovod + MVAPICH2)"),
    Published("Hy-Fi, 2,048 V100 efficiency", "lassen", RESNET50, 2048, "efficiency", 0.945,
              "Jain et al. 2022, Hy-Fi, ISC High Performance"),
]

# Two global assumptions, the same for every point (not fitted per point):
DEFAULT_MFU = 0.5          # cuDNN / oneDNN convolutions reach about half of peak in ResNet-50 training
DEFAULT_JITTER_CV = 0.03   # 3% step-to-step variation per process (system noise, input pipeline)
DEFAULT_BUCKET = 25 * MB   # PyTorch DDP's default bucket_cap_mb


# ----------------------------------------------------------------------------------------- collectives
def ring_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Ring allreduce: reduce-scatter then allgather, 2(p-1) steps of n/p bytes each."""
    if p < 1:
        raise ValueError(f"p must be >= 1 ranks, got {p}")
    if p == 1:
        return 0.0
    return 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * nbytes * link.beta


def tree_allreduce_time(nbytes: float, p: int, link: Link) -> float:
    """Pipelined (double binary) tree: reduce up, broadcast down; log-depth latency, 2 n beta bandwidth."""
    if p < 1:
        raise ValueError(f"p must be >= 1 ranks, got {p}")
    if p == 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * link.alpha + 2 * nbytes * link.beta


ALGORITHMS = {"ring": ring_allreduce_time, "tree": tree_allreduce_time}


def allreduce_time(nbytes: float, p: int, link: Link, algo: str = "auto") -> float:
    """Allreduce of ``nbytes`` over ``p`` ranks on one kind of link; ``auto`` takes the faster algorithm."""
    if algo == "auto":
        return min(f(nbytes, p, link) for f in ALGORITHMS.values())
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown allreduce algorithm {algo!r}; use 'ring', 'tree' or 'auto'")
    return ALGORITHMS[algo](nbytes, p, link)


def hierarchical_allreduce_time(nbytes: float, world_size: int, system: System, algo: str = "auto") -> float:
    """Reduce-scatter in the node, allreduce between nodes at node bandwidth, allgather in the node."""
    g = min(world_size, system.devices_per_node)
    n_nodes = math.ceil(world_size / g)
    intra = 0.0
    if g > 1:  # reduce-scatter + allgather = one ring allreduce inside the node
        intra = ring_allreduce_time(nbytes, g, system.intra)
    # Between nodes every node holds the node's sum in g slices; all slices share the node's NICs,
    # so it costs one allreduce of nbytes at the node's injection bandwidth.
    inter = allreduce_time(nbytes, n_nodes, system.inter, algo) if n_nodes > 1 else 0.0
    return intra + inter


# ----------------------------------------------------------------------------------------- one step
def expected_max_normal(p: int) -> float:
    """E[max of p independent standard normals] (Blom's approximation; 0 for p = 1)."""
    if p <= 1:
        return 0.0
    return NormalDist().inv_cdf((p - 0.375) / (p + 0.25))


def bucket_sizes(grad_bytes: float, bucket_bytes: float) -> list[float]:
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive (use a huge value for a single bucket)")
    n = max(1, math.ceil(grad_bytes / bucket_bytes))
    return [bucket_bytes] * (n - 1) + [grad_bytes - bucket_bytes * (n - 1)]


def comm_schedule(t_fwd: float, t_bwd: float, buckets: list[float], allreduce, overlap: bool = True) -> float:
    """End time of the last bucket's allreduce. Buckets become ready evenly through the backward pass."""
    end = t_fwd + t_bwd if not overlap else 0.0
    n = len(buckets)
    for i, b in enumerate(buckets):
        ready = t_fwd + t_bwd * (i + 1) / n if overlap else t_fwd + t_bwd
        end = max(ready, end) + allreduce(b)
    return end


@dataclass
class StepPrediction:
    world_size: int
    step_time: float       # seconds per step
    compute_time: float    # seconds of forward + backward per step on one device
    comm_time: float       # total allreduce time per step (overlapped or not)
    exposed_comm: float    # allreduce time not hidden behind the backward pass
    throughput: float      # samples/s over all devices
    speedup: float = float("nan")
    efficiency: float = float("nan")


def step(workload: Workload, system: System, world_size: int, *, bucket_bytes: float = DEFAULT_BUCKET,
         overlap: bool = True, algo: str = "auto", jitter_cv: float = DEFAULT_JITTER_CV,
         num_stages: int = 1, n_micro: int = 8) -> StepPrediction:
    """Predict one data-parallel (optionally pipelined) training step on ``world_size`` devices."""
    if world_size < 1 or world_size % num_stages:
        raise ValueError(f"world_size={world_size} must be a positive multiple of num_stages={num_stages}")
    replicas = world_size // num_stages
    t_sample = workload.flops_per_sample / (system.peak_flops * workload.mfu) / num_stages
    compute = t_sample * workload.micro_batch
    if num_stages > 1:  # GPipe: the bubble idles (S-1)/(M+S-1) of the step
        compute *= (n_micro + num_stages - 1) / n_micro
    t_fwd, t_bwd = compute / 3, 2 * compute / 3
    grad = workload.grad_bytes / num_stages

    def ar(nbytes):
        return hierarchical_allreduce_time(nbytes, replicas, system, algo)

    buckets = bucket_sizes(grad, bucket_bytes)
    comm = sum(ar(b) for b in buckets)
    end = comm_schedule(t_fwd, t_bwd, buckets, ar, overlap) if replicas > 1 else compute
    exposed = max(0.0, end - compute)
    t = (compute + exposed) * (1 + jitter_cv * expected_max_normal(world_size))
    samples = workload.micro_batch * replicas
    return StepPrediction(world_size, t, compute, comm, exposed, samples / t)


def predict(workload: Workload, system: System, world_sizes, **kw) -> list[StepPrediction]:
    """Throughput, speedup and efficiency (against one device of the same system) at each world size."""
    # the reference is one device running the whole model, without pipeline stages
    serial_kw = {k: v for k, v in kw.items() if k not in ("num_stages", "n_micro")}
    base = step(workload, system, 1, **serial_kw).throughput
    out = []
    for n in world_sizes:
        s = step(workload, system, n, **kw)
        s.speedup = s.throughput / base
        s.efficiency = s.speedup / n
        out.append(s)
    return out


# ----------------------------------------------------------------------------------------- validation
def predicted_value(point: Published, **kw) -> float:
    system = SYSTEMS[point.system]
    p = predict(point.workload, system, [point.world_size], **kw)[0]
    return {"throughput": p.throughput, "speedup": p.speedup, "efficiency": p.efficiency}[point.metric]


def validate(points: list[Published] | None = None, tolerance: float = 0.15, **kw) -> list[dict]:
    """Predicted against published for every point: a row per point with the relative error."""
    rows = []
    for pt in points or PUBLISHED:
        pred = predicted_value(pt, **kw)
        err = (pred - pt.value) / pt.value
        rows.append(dict(label=pt.label, world_size=pt.world_size, metric=pt.metric, published=pt.value,
                         predicted=pred, rel_error=err, within=abs(err) <= tolerance, source=pt.source))
    return rows


def _fmt(v: float, metric: str) -> str:
    if metric == "throughput":
        return f"{v:,.0f}/s"
    return f"{v:.3f}"


def format_validation(rows: list[dict]) -> str:
    head = f"{'published result':<34} {'N':>6} {'published':>12} {'predicted':>12} {'error':>7}  ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['label']:<34} {r['world_size']:>6} {_fmt(r['published'], r['metric']):>12} "
                     f"{_fmt(r['predicted'], r['metric']):>12} {100 * r['rel_error']:>+6.1f}%  {r['within']}")
    return "\n".join(lines)


def plot_validation(rows: list[dict], ax=None):
    """Predicted against published (log-log for throughputs, ratio for the rest), with the +-15% band."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 4))
    ratios = [r["predicted"] / r["published"] for r in rows]
    y = range(len(rows))
    ax.axvspan(0.85, 1.15, color="0.9", label="within 15%")
    ax.axvline(1.0, color="0.5", lw=1)
    ax.scatter(ratios, list(y), color="C0", zorder=3)
    ax.set_yticks(list(y), [r["label"] for r in rows], fontsize=8)
    ax.set_xlabel("predicted / published")
    ax.set_xlim(0.6, 1.4)
    ax.legend(loc="lower right", fontsize=8)
    ax.invert_yaxis()
    return ax


# ----------------------------------------------------------------------------------------- calibration here
def fit_alpha_beta(sizes_bytes, seconds, p: int = 2) -> Link:
    """Least-squares fit (in relative error) of ``t = 2(p-1) alpha + 2(p-1)/p n beta`` (ring allreduce) to measured times."""
    import numpy as np
    n = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if n.shape != t.shape or n.size < 2:
        raise ValueError("need at least two (size, time) measurements of the same length")
    if p < 2:
        raise ValueError("an allreduce on 1 rank sends nothing: measure on p >= 2 ranks")
    a = np.stack([np.full_like(n, 2 * (p - 1)), 2 * (p - 1) / p * n], axis=1)
    w = 1.0 / t[:, None]  # relative errors: small messages (latency) count as much as big ones (bandwidth)
    (alpha, beta), *_ = np.linalg.lstsq(a * w, t * w[:, 0], rcond=None)
    alpha, beta = max(float(alpha), 1e-9), max(float(beta), 1e-15)
    return Link(alpha=alpha, bandwidth=1.0 / beta)


def measure_allreduce(sizes_bytes=(4096, 65536, 1 << 20, 4 << 20), repeats: int = 5, warmup: int = 2) -> dict:
    """Time ``MPI.Allreduce`` of float32 buffers on every rank of COMM_WORLD (run it on all ranks).

    Returns ``{size_bytes: median seconds}``, each the slowest rank's time (what an allreduce costs the job).
    """
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    out = {}
    for nbytes in sizes_bytes:
        x = np.ones(max(1, int(nbytes) // 4), dtype=np.float32)
        y = np.empty_like(x)
        times = []
        for i in range(warmup + repeats):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(x, y, op=MPI.SUM)
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if i >= warmup:
                times.append(dt)
        out[int(x.nbytes)] = float(np.median(times))
    return out


def measure_compute(micro_batch: int = 16, image: int = 32, repeats: int = 3, width: int = 16) -> dict:
    """Per-sample forward + backward time of the course's SmallCNN on this CPU (one thread)."""
    import torch

    from ddlcourse.models.small import SmallCNN
    torch.manual_seed(0)
    model = SmallCNN(in_ch=1, n_classes=3, width=width)
    x = torch.randn(micro_batch, 1, image, image)  # (batch, channels, height, width)
    y = torch.randint(0, 3, (micro_batch,))
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if i:  # the first pass warms up the allocator
            times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    return {"t_sample": min(times) / micro_batch, "n_params": n_params, "micro_batch": micro_batch}


def local_system(link: Link, t_sample: float, flops_per_sample: float = 1e9) -> System:
    """A 'system' of single-core CPU ranks joined by the measured link, for predictions about this machine."""
    return System("this machine (measured)", devices_per_node=1024, peak_flops=flops_per_sample / t_sample,
                  intra=link, inter=link, source="measured here")


def local_workload(n_params: float, micro_batch: int, flops_per_sample: float = 1e9) -> Workload:
    return Workload("SmallCNN (measured)", flops_per_sample, n_params, micro_batch, mfu=1.0)


def what_if(base: Published | None = None, **changes) -> dict:
    """Re-predict a published configuration with changes, e.g. ``bytes_per_grad=2`` or ``inter=Link(...)``.

    Keys that belong to :class:`Workload` or :class:`System` change those; others go to :func:`step`
    (``num_stages``, ``bucket_bytes``, ``overlap``, ``algo``, ``jitter_cv``, ``world_size``).
    """
    base = base or PUBLISHED[2]
    wl_keys = {f for f in Workload.__dataclass_fields__}
    sys_keys = {f for f in System.__dataclass_fields__}
    wl = replace(base.workload, **{k: v for k, v in changes.items() if k in wl_keys})
    sysm = replace(SYSTEMS[base.system], **{k: v for k, v in changes.items() if k in sys_keys})
    kw = {k: v for k, v in changes.items() if k not in wl_keys | sys_keys}
    n = kw.pop("world_size", base.world_size)
    p = predict(wl, sysm, [n], **kw)[0]
    return {"throughput": p.throughput, "efficiency": p.efficiency, "step_time": p.step_time,
            "exposed_comm": p.exposed_comm, "comm_time": p.comm_time}
