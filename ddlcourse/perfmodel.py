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

:data:`SYSTEMS` holds stated hardware parameters; :data:`PUBLISHED` holds published results, each with a
precise source and a role. A **calibration** point fixes the one fitted constant, the fraction of peak
``mfu`` of its device, so the model reproduces it by construction (:func:`calibrate_mfu`); a **held-out**
point is predicted with constants fixed elsewhere and compared (:func:`validate`): only those are checks.
:func:`sensitivity` shows how much a prediction rests on each constant. The constants measured on your own
machine come from :func:`measure_allreduce`, :func:`fit_alpha_beta` and :func:`measure_compute`.

For any PyTorch model (the labs' U-Nets and video model), :func:`workload_from_model` counts the parameters and
the FLOPs (``FlopCounterMode`` on the meta device), and :func:`predict_lab` predicts its weak scaling on a
published system, with and without overlap; the labs plot it (:func:`plot_lab_prediction`) as a prediction.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from ddlcourse.models.small import SmallCNN

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
                    source="He et al. 2016, Deep Residual Learning for Image Recognition, CVPR (Table 1)")

# Hardware parameters from vendor specifications. Latencies are end-to-end software latencies of one
# message (NCCL/MPI over NVLink ~10 us, over InfiniBand ~5 us), not the wire latency; they are assumptions.
P100_FP32 = 10.6e12          # Tesla P100 SXM2 fp32 peak (NVIDIA P100 datasheet); no tensor cores
V100_FP32 = 15.7e12          # Tesla V100 SXM2 fp32 peak (NVIDIA V100 datasheet)
V100_TENSOR_FP16 = 125e12    # V100 SXM2 fp16 tensor-core peak: what mixed-precision training can use
SYSTEMS: dict[str, System] = {
    "bigbasin": System("Big Basin: 8 P100 SXM2 per server (NVLink), 50 Gbit/s Ethernet between servers", 8,
                       P100_FP32, intra=Link(10e-6, 40 * GB), inter=Link(10e-6, 50e9 / 8),
                       source="Goyal et al. 2017 (hardware as described in the paper); P100 datasheet; the "
                              "40 GB/s ring bandwidth inside the server is our assumption for NVLink 1"),
    "summit": System("Summit: 6 V100 per node, dual-rail EDR InfiniBand", 6, V100_FP32,
                     intra=Link(10e-6, 50 * GB), inter=Link(5e-6, 2 * 12.5 * GB),
                     source="OLCF Summit user guide: 6 V100, NVLink 2 (50 GB/s), 2 x EDR IB 100 Gb/s per node"),
    # Frontera: 2 x Xeon Platinum 8280 (2 x 28 cores), 4 MPI processes per node -> 14 cores each.
    # Peak per process: 14 cores x 64 fp32 FLOP/cycle (2 AVX-512 FMA units) x 2.0 GHz AVX-512 clock.
    "frontera": System("Frontera: 2 x Xeon 8280 (Cascade Lake), 4 processes per node, HDR-100 IB", 4,
                       14 * 64 * 2.0e9, intra=Link(1e-6, 10 * GB), inter=Link(5e-6, 12.5 * GB),
                       source="TACC Frontera user guide; Intel Xeon Platinum 8280 specifications"),
}


@dataclass(frozen=True)
class Published:
    """One published result, the configuration it was measured on, and what the model does with it.

    ``role`` is ``"calibration"`` (the point fixes a constant, the fraction of peak ``mfu``, so the model
    reproduces it by construction: it is not a check) or ``"held-out"`` (predicted with constants fixed
    elsewhere, then compared: a check). ``calibrated_by`` names the calibration point whose ``mfu`` a
    held-out point uses. ``baseline`` is the number of devices an efficiency is measured against.
    ``assumed`` lists what the source does not state and the model had to assume.
    """
    key: str
    label: str
    system: str
    workload: Workload
    world_size: int
    metric: str          # "throughput" (samples/s, all devices) or "efficiency"
    value: float
    source: str          # authors, year, title, venue, and where in the paper the number is
    role: str            # "calibration" or "held-out"
    calibrated_by: str = ""
    baseline: int = 1
    assumed: str = ""


_GOYAL = ("Goyal et al. 2017, Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour, arXiv:1706.02677 "
          "(abstract)")
PUBLISHED: list[Published] = [
    # 90 epochs of ImageNet-1k's 1,281,167 training images in about one hour on 256 P100, batch 8192 (32 per GPU)
    Published("goyal2017_throughput", "ResNet-50, 256 P100, batch 8k", "bigbasin",
              replace(RESNET50, micro_batch=32), 256, "throughput", 90 * 1_281_167 / 3600,
              _GOYAL + ": batch 8192 on 256 GPUs in one hour; 90 epochs", "calibration",
              assumed="fp32 compute; 'one hour' taken as 3600 s of training"),
    Published("goyal2017_efficiency", "ResNet-50, 8 -> 256 P100 efficiency", "bigbasin",
              replace(RESNET50, micro_batch=32), 256, "efficiency", 0.90,
              _GOYAL + ": ~90% scaling efficiency from 8 to 256 GPUs", "held-out",
              calibrated_by="goyal2017_throughput", baseline=8),
    Published("jain2019_frontera", "ResNet-50, 8,192 Frontera processes", "frontera", RESNET50, 2048 * 4,
              "throughput", 250e3,
              "Jain, Awan, Subramoni & Panda 2019, Scaling TensorFlow, PyTorch, and MXNet using MVAPICH2 for "
              "High-Performance Deep Learning on Frontera, DLS workshop at SC19 (abstract: 250,000 images/s "
              "on 2,048 nodes, 4 processes per node)", "calibration",
              assumed="64 images per process"),
    Published("yin2019_summit", "ResNet-50, 6,144 V100 Summit efficiency", "summit", RESNET50, 6144,
              "efficiency", 0.87,
              "Yin, Gahlot, Laanait, Maheshwari, Morrison, Dash & Shankar 2019, Strategies to Deploy and Scale "
              "Deep Learning on the Summit Supercomputer, DLS workshop at SC19 (abstract: 87% scaling "
              "efficiency on 1,024 nodes, 6,144 V100)", "held-out",
              calibrated_by="goyal2017_throughput", baseline=6,
              assumed="efficiency against one node; 64 images per GPU; fp32 peak (no tensor cores) at the "
                      "fraction of peak calibrated on the P100 run"),
]
POINTS: dict[str, Published] = {pt.key: pt for pt in PUBLISHED}

# Global assumptions, the same for every point (not fitted):
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


# ----------------------------------------------------------------------------------------- calibration and checks
def _throughput(workload: Workload, system: System, world_size: int, **kw) -> float:
    return step(workload, system, world_size, **kw).throughput


def predicted_value(point: Published, workload: Workload | None = None, system: System | None = None,
                    **kw) -> float:
    """The model's value of ``point``'s metric, with the point's own workload and system unless given."""
    wl = workload or configured(point)[0]
    sysm = system or SYSTEMS[point.system]
    n = point.world_size
    if point.metric == "throughput":
        return _throughput(wl, sysm, n, **kw)
    if point.metric == "efficiency":
        b = point.baseline
        return (_throughput(wl, sysm, n, **kw) / n) / (_throughput(wl, sysm, b, **kw) / b)
    raise ValueError(f"unknown metric {point.metric!r}; use 'throughput' or 'efficiency'")


def calibrate_mfu(point: Published, **kw) -> float:
    """The fraction of peak (``mfu``) that makes the model reproduce ``point``'s throughput exactly.

    This is what "calibration" means: the point is reproduced *by construction*, so it checks nothing.
    Solved by bisection (throughput grows with ``mfu``).
    """
    if point.metric != "throughput":
        raise ValueError(f"calibrate on a throughput, not on {point.metric!r} ({point.label})")
    lo, hi = 1e-4, 1.0
    if predicted_value(point, replace(point.workload, mfu=hi), **kw) < point.value:
        raise ValueError(f"{point.label}: even 100% of peak is slower than published; check the hardware constants")
    for _ in range(80):
        mid = (lo + hi) / 2
        if predicted_value(point, replace(point.workload, mfu=mid), **kw) < point.value:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def configured(point: Published, **kw) -> tuple[Workload, System]:
    """``point``'s workload with its calibrated ``mfu`` (calibration points solve their own), and its system."""
    if point.role == "calibration":
        mfu = calibrate_mfu(point, **kw)
    elif point.role == "held-out":
        mfu = calibrate_mfu(POINTS[point.calibrated_by], **kw)
    else:
        raise ValueError(f"role must be 'calibration' or 'held-out', got {point.role!r}")
    return replace(point.workload, mfu=mfu), SYSTEMS[point.system]


def validate(points: list[Published] | None = None, tolerance: float = 0.15, **kw) -> list[dict]:
    """Predicted against published for every point: a row per point with its role and relative error.

    Only held-out rows are checks (``counted``); calibration rows match by construction.
    """
    rows = []
    for pt in points or PUBLISHED:
        wl, sysm = configured(pt, **kw)
        pred = predicted_value(pt, wl, sysm, **kw)
        err = (pred - pt.value) / pt.value
        held = pt.role == "held-out"
        rows.append(dict(key=pt.key, label=pt.label, role=pt.role, counted=held, world_size=pt.world_size,
                         metric=pt.metric, published=pt.value, predicted=pred, rel_error=err, mfu=wl.mfu,
                         within=(abs(err) <= tolerance) if held else None, source=pt.source,
                         assumed=pt.assumed))
    return rows


def _fmt(v: float, metric: str) -> str:
    if metric == "throughput":
        return f"{v:,.0f}/s"
    return f"{v:.3f}"


def format_validation(rows: list[dict]) -> str:
    head = (f"{'published result':<40} {'role':<11} {'N':>5} {'published':>12} {'predicted':>12} "
            f"{'error':>7}  mfu   check")
    lines = [head, "-" * len(head)]
    for r in rows:
        check = "within 15%: " + str(r["within"]) if r["counted"] else "(by construction)"
        lines.append(f"{r['label']:<40} {r['role']:<11} {r['world_size']:>5} {_fmt(r['published'], r['metric']):>12} "
                     f"{_fmt(r['predicted'], r['metric']):>12} {100 * r['rel_error']:>+6.1f}%  {r['mfu']:.2f}  {check}")
    return "\n".join(lines)


def format_sources(rows: list[dict]) -> str:
    """One line per point: its source, and what the model assumed that the source does not state."""
    out = []
    for r in rows:
        out.append(f"- {r['label']}: {r['source']}" + (f". Assumed: {r['assumed']}." if r["assumed"] else ""))
    return "\n".join(out)


def plot_validation(rows: list[dict], ax=None):
    """Predicted / published per point, held-out points filled, calibration points hollow, with the +-15% band."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if ax is None:
        _, ax = plt.subplots(figsize=(4.8, 2.8))
    ax.axvspan(0.85, 1.15, color="0.9", label="within 15%")
    ax.axvline(1.0, color="0.5", lw=1)
    for i, r in enumerate(rows):
        ratio = r["predicted"] / r["published"]
        held = r["counted"]
        ax.scatter([ratio], [i], zorder=3, color="C0", facecolors="C0" if held else "none",
                   label=("held out (a check)" if held else "calibration (by construction)")
                   if i == [j for j, q in enumerate(rows) if q["counted"] == held][0] else None)
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
    ax.set_xlabel("predicted / published")
    ax.set_xlim(0.6, 1.4)
    ax.legend(loc="lower right", fontsize=7)
    ax.invert_yaxis()
    return ax


# the model's constants, and how to change one of them by a factor
CONSTANTS = {
    "fraction of peak (mfu)": lambda wl, sy, kw, f: (replace(wl, mfu=wl.mfu * f), sy, kw),
    "step-time jitter (jitter_cv)": lambda wl, sy, kw, f: (wl, sy, {**kw, "jitter_cv": kw.get("jitter_cv", DEFAULT_JITTER_CV) * f}),
    "network bandwidth (inter)": lambda wl, sy, kw, f: (wl, replace(sy, inter=replace(sy.inter, bandwidth=sy.inter.bandwidth * f)), kw),
    "network latency (inter alpha)": lambda wl, sy, kw, f: (wl, replace(sy, inter=replace(sy.inter, alpha=sy.inter.alpha * f)), kw),
    "in-node bandwidth (intra)": lambda wl, sy, kw, f: (wl, replace(sy, intra=replace(sy.intra, bandwidth=sy.intra.bandwidth * f)), kw),
    "in-node latency (intra alpha)": lambda wl, sy, kw, f: (wl, replace(sy, intra=replace(sy.intra, alpha=sy.intra.alpha * f)), kw),
    "bucket size": lambda wl, sy, kw, f: (wl, sy, {**kw, "bucket_bytes": kw.get("bucket_bytes", DEFAULT_BUCKET) * f}),
}


def sensitivity(point: Published, rel: float = 0.2, **kw) -> list[dict]:
    """The prediction of ``point`` with each constant scaled by ``1 - rel`` and ``1 + rel``, one at a time.

    The other constants stay as calibrated (the ``mfu`` is not re-fitted), so each row shows how much the
    prediction rests on that one constant. Rows are sorted by the size of the swing.
    """
    wl, sy = configured(point, **kw)
    base = predicted_value(point, wl, sy, **kw)
    rows = []
    for name, change in CONSTANTS.items():
        vals = []
        for f in (1 - rel, 1 + rel):
            w2, s2, k2 = change(wl, sy, dict(kw), f)
            vals.append(predicted_value(point, w2, s2, **k2))
        rows.append(dict(constant=name, low=vals[0], high=vals[1], base=base,
                         swing=(max(vals) - min(vals)) / base))
    return sorted(rows, key=lambda r: -r["swing"])


def format_sensitivity(rows: list[dict], metric: str = "efficiency", rel: float = 0.2) -> str:
    head = f"{'constant':<32} {f'-{rel:.0%}':>12} {'as used':>12} {f'+{rel:.0%}':>12} {'swing':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['constant']:<32} {_fmt(r['low'], metric):>12} {_fmt(r['base'], metric):>12} "
                     f"{_fmt(r['high'], metric):>12} {100 * r['swing']:>6.1f}%")
    return "\n".join(lines)


def plot_sensitivity(rows: list[dict], ax=None, title: str = ""):
    """A tornado plot: the change of the prediction when each constant moves by -rel (left) and +rel (right)."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 2.8))
    y = range(len(rows))
    lo = [100 * (r["low"] / r["base"] - 1) for r in rows]
    hi = [100 * (r["high"] / r["base"] - 1) for r in rows]
    ax.barh(list(y), lo, color="C3", label="constant -20%")
    ax.barh(list(y), hi, color="C0", label="constant +20%")
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_yticks(list(y), [r["constant"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("change of the prediction (%)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return ax


# ----------------------------------------------------------------------------------------- calibration here
def fit_alpha_beta(sizes_bytes, seconds, p: int = 2) -> Link:
    """Least-squares fit (in relative error) of ``t = 2(p-1) alpha + 2(p-1)/p n beta`` (ring allreduce) to measured times."""
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
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
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
    """Re-predict a published configuration (default: the Summit run) with changes.

    E.g. ``bytes_per_grad=2``, ``inter=Link(...)``, ``peak_flops=V100_TENSOR_FP16``. Keys that belong to
    :class:`Workload` or :class:`System` change those; others go to :func:`step` (``num_stages``,
    ``bucket_bytes``, ``overlap``, ``algo``, ``jitter_cv``, ``world_size``). The base's ``mfu`` is the
    calibrated one. Efficiency is against one device of the changed system.
    """
    base = base or POINTS["yin2019_summit"]
    wl0, sys0 = configured(base)
    wl_keys = {f for f in Workload.__dataclass_fields__}
    sys_keys = {f for f in System.__dataclass_fields__}
    wl = replace(wl0, **{k: v for k, v in changes.items() if k in wl_keys})
    sysm = replace(sys0, **{k: v for k, v in changes.items() if k in sys_keys})
    kw = {k: v for k, v in changes.items() if k not in wl_keys | sys_keys}
    n = kw.pop("world_size", base.world_size)
    p = predict(wl, sysm, [n], **kw)[0]
    return {"throughput": p.throughput, "efficiency": p.efficiency, "step_time": p.step_time,
            "exposed_comm": p.exposed_comm, "comm_time": p.comm_time, "compute_time": p.compute_time,
            "global_batch": wl.micro_batch * (n // kw.get("num_stages", 1))}


# ----------------------------------------------------------------------------------------- any model (the labs)
WEAK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # GPUs of the labs' weak-scaling predictions


def _meta_inputs(sample_input):
    """``sample_input`` as a tuple of meta tensors: a tensor, a tuple of tensors, or one shape (a tuple of ints)."""
    if isinstance(sample_input, torch.Tensor):
        items = (sample_input,)
    elif isinstance(sample_input, (tuple, list, torch.Size)) and sample_input and all(
            isinstance(d, int) for d in sample_input):
        items = (torch.empty(tuple(sample_input), device="meta"),)           # one input of this shape
    elif isinstance(sample_input, (tuple, list)) and sample_input and all(
            isinstance(t, torch.Tensor) for t in sample_input):
        items = tuple(sample_input)
    else:
        raise TypeError("sample_input must be a tensor, a tuple of tensors, or one input shape such as "
                        f"(1, 3, 128, 128); got {type(sample_input).__name__}")
    batch = items[0].shape[0] if items[0].dim() else 0
    if batch < 1:
        raise ValueError(f"sample_input needs a batch dimension of at least 1 sample first; got shape "
                         f"{tuple(items[0].shape)}")
    return tuple(torch.empty_like(t, device="meta") for t in items), batch


def count_flops(model, sample_input) -> tuple[float, int]:
    """Forward FLOPs per sample of ``model`` and its trainable parameters.

    The FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on a copy of the model on the *meta*
    device: nothing is computed or allocated, so a cluster-size model and batch cost milliseconds. The counter
    counts matrix products and convolutions (2 FLOPs per multiply-add); normalisation, activations and pooling
    are not counted (a few percent for convolutional nets). ``sample_input`` is a tensor (or tuple of tensors)
    whose first dimension is the batch, or one input shape; the count is divided by that batch.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if n_params == 0:
        raise ValueError("the model has no trainable parameters: data parallelism would allreduce nothing")
    inputs, batch = _meta_inputs(sample_input)
    meta_model = copy.deepcopy(model).to("meta")
    try:
        with FlopCounterMode(display=False) as counter:
            meta_model(*inputs)
    except Exception as e:  # a shape mismatch, or an op with no meta kernel
        raise ValueError(f"could not run the model on inputs of shape {[tuple(t.shape) for t in inputs]} "
                         f"(on the meta device): {e}") from e
    flops = counter.get_total_flops()
    if flops == 0:
        raise ValueError("FlopCounterMode counted no FLOPs: the model has no matrix product or convolution")
    return flops / batch, n_params


def workload_from_model(name: str, model, sample_input, micro_batch: int, mfu: float, bytes_per_grad: int = 4,
                        source: str = "") -> Workload:
    """A :class:`Workload` for any PyTorch model: parameters counted, training FLOPs = 3 x forward FLOPs.

    The backward pass costs about twice the forward (a gradient for the inputs and one for the weights), so
    one training sample costs 3x its forward FLOPs (:func:`count_flops`). ``micro_batch`` is the samples per
    device per step; ``mfu`` the fraction of the device's peak FLOP/s the compute reaches, an assumption
    (or a calibrated value, :func:`calibrate_mfu`) that the caller states.
    """
    if not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be a positive number of samples per device, got {micro_batch!r}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu is a fraction of peak FLOP/s, in (0, 1]; got {mfu!r}")
    if bytes_per_grad not in (1, 2, 4, 8):
        raise ValueError(f"bytes_per_grad must be 1, 2, 4 or 8 bytes per gradient element, got {bytes_per_grad!r}")
    fwd, n_params = count_flops(model, sample_input)
    return Workload(name, flops_per_sample=3 * fwd, n_params=n_params, micro_batch=micro_batch,
                    bytes_per_grad=bytes_per_grad, mfu=mfu,
                    source=source or "parameters counted, forward FLOPs by torch FlopCounterMode, x3 for training")


def predict_lab(workload: Workload, system: System | str = "summit", world_sizes=WEAK_SIZES,
                **kw) -> dict[bool, list[StepPrediction]]:
    """Weak scaling of ``workload`` on ``system`` (a :data:`SYSTEMS` key or a :class:`System`), with the
    gradient allreduce overlapped with the backward pass (key ``True``) and after it (key ``False``)."""
    if isinstance(system, str):
        if system not in SYSTEMS:
            raise ValueError(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS)}")
        system = SYSTEMS[system]
    sizes = sorted(set(int(n) for n in world_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"world_sizes must be positive numbers of devices, got {list(world_sizes)}")
    return {ov: predict(workload, system, sizes, overlap=ov, **kw) for ov in (True, False)}


def dominant_part(p: StepPrediction) -> str:
    """``"compute"`` or ``"gradient allreduce"``: the larger of a step's compute and its allreduce time."""
    return "compute" if p.compute_time >= p.comm_time else "gradient allreduce"


def _flops_per_grad_byte(workload: Workload) -> float:
    """Training FLOPs of one device's step per byte of gradient it allreduces: high means compute-bound."""
    return workload.flops_per_sample * workload.micro_batch / workload.grad_bytes


def format_lab_prediction(workload: Workload, pred: dict[bool, list[StepPrediction]], system_name: str) -> str:
    """The lines a lab prints: the workload, the efficiency at the largest size, and what dominates a step."""
    ov, no = pred[True][-1], pred[False][-1]
    n = ov.world_size
    return "\n".join([
        f"{workload.name}: {workload.n_params / 1e6:.2f} M parameters ({workload.grad_bytes / MB:.1f} MB of "
        f"gradients), {workload.flops_per_sample / 1e9:.1f} GFLOP per training sample, {workload.micro_batch} "
        f"samples per GPU, fraction of peak {workload.mfu:.2f} (assumed)",
        f"PREDICTED on {n} GPUs of {system_name}: weak-scaling efficiency {ov.efficiency:.2f} with overlap, "
        f"{no.efficiency:.2f} without",
        f"PREDICTED per step at {n} GPUs: compute {1e3 * ov.compute_time:.1f} ms, gradient allreduce "
        f"{1e3 * ov.comm_time:.1f} ms ({1e3 * ov.exposed_comm:.1f} ms of it exposed with overlap): "
        f"{dominant_part(ov)} dominates; waiting for the slowest of {n} GPUs adds "
        f"{1e3 * (ov.step_time - ov.compute_time - ov.exposed_comm):.1f} ms",
        f"training FLOPs per gradient byte: {_flops_per_grad_byte(workload):,.0f} per step "
        f"(ResNet-50 at 64 images per GPU: {_flops_per_grad_byte(RESNET50):,.0f})",
    ])


def plot_lab_prediction(pred: dict[bool, list[StepPrediction]], title: str = "", axes=None):
    """Predicted weak-scaling speedup and efficiency, with and without overlap, every curve labelled PREDICTED."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
    sizes = [r.world_size for r in pred[True]]
    for ov, mk in ((True, "o-"), (False, "s--")):
        lab = "PREDICTED, " + ("overlapped allreduce" if ov else "allreduce after backward")
        axes[0].plot(sizes, [r.speedup for r in pred[ov]], mk, ms=4, label=lab)
        axes[1].plot(sizes, [r.efficiency for r in pred[ov]], mk, ms=4, label=lab)
    axes[0].plot(sizes, sizes, "k:", label="ideal")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log", base=2)
    axes[1].set_xscale("log", base=2)
    axes[1].set_ylim(0, 1.05)
    axes[0].set(xlabel="GPUs", ylabel="speedup", title="PREDICTED weak scaling" + (f": {title}" if title else ""))
    axes[1].set(xlabel="GPUs", ylabel="efficiency", title="PREDICTED efficiency (perfmodel, not measured)")
    for ax in axes:
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].figure.tight_layout()
    return axes
