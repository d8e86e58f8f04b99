"""Budget planner: will every notebook and lab of a scale profile fit the hardware it is meant for?

``python -m ddlcourse plan [--scale cluster]`` prints one row per section of :data:`ddlcourse.config.PROFILES`:
ranks, parameters, the estimated GPU memory of one rank split into weights, gradients, optimizer state,
activations and the rest, the host memory of one node, the data one rank holds and the disk its data sets take.

How each number is estimated (the same text is printed under the table):

* **Workloads.** A section runs several things (a serial reference, a 1-rank point of a scaling experiment,
  the main data-parallel run ...). :data:`SECTIONS` lists, per section, the ones that hold the most memory,
  with the real model imported from the package and the real per-rank batch shape read from the profile.
  A row shows the workload with the largest GPU total (named in the ``workload`` column).
* **Weights, gradients** from the parameters of the model (bytes per element from their dtype).
  **Optimizer state**: tensors of the parameters' size per parameter -- SGD 0, SGD with momentum and LARS 1,
  Adam, AdamW and LAMB 2, SOAP 2 plus two ``d x d`` matrices per dimension ``d`` of every parameter.
* **Activations**: the model's forward pass and loss run on *meta* tensors of the real per-rank batch shape
  (no memory is allocated, nothing is computed); ``torch.autograd.graph.saved_tensors_hooks`` sees every
  tensor autograd keeps for backward, each storage counted once and the parameters left out. The batch
  itself (inputs and targets) is counted too: it lives on the device during the step. Tested against a real
  CPU forward+backward (:func:`ddlcourse.memory.measure`) within 10%.
* **Other** (in the GPU total): the gradients that flow during backward, taken as twice the largest saved
  tensor, plus :data:`CUDA_OVERHEAD` for the CUDA context (:data:`CUDA_CONTEXT_BYTES`) and the cuDNN/cuBLAS
  workspaces and allocator slack (:data:`WORKSPACE_BYTES`). Both from one H200 (torch 2.11, CUDA 13.0, cuDNN 9,
  2026-11-28, ``plan --measure`` in env/gpu_smoke.sh): 769 MiB of device memory lay outside the caching
  allocator once torch, cuDNN and cuBLAS were loaded; the largest workspace of the course's workloads was the
  backward of lab 2's 2-D section UNet, whose peak rose from 0.96 GiB with cuDNN off to 2.14 GiB with it on
  (1.18 GiB of workspace). ``plan --measure`` runs every workload once on a GPU and compares.
* **Communicators, contexts, second copies** (the ``comm+ctx`` column, in the GPU total): what GPU 0 holds
  besides the workload, counted per section by :data:`OVERHEADS` (see :func:`overheads`). GPU 0 is the
  busiest GPU: local rank 0 belongs to every "first k ranks" subgroup, and the notebook kernel runs there.

  - one NCCL communicator for the world, one per subgroup the notebook creates (``dist.subgroup(k)``, so
    ``dist.on_first_ranks(k, ...)`` and every ``training.run`` / ``scaling_experiment`` on k ranks), one per
    dimension of a multi-dimensional device mesh (``dcp.mesh_2d`` / ``init_device_mesh`` with 2 dimensions;
    a 1-D mesh over the world reuses the world's group) and Horovod's own when Horovod all-reduces on the GPU.
    The engines cache their groups for the life of the cluster, so they add up over a notebook.
    :data:`NCCL_COMM_BYTES` (1 GiB) per communicator of 2 or more ranks. The assumption, from NCCL's
    documented defaults (``NCCL_BUFFSIZE`` 4 MiB for the Simple protocol, plus about 4.6 MiB for LL128 and
    0.5 MiB for LL, per channel and per peer connection; ``NCCL_MAX_NCHANNELS`` up to 32 on NVLink/NVSwitch
    nodes): a ring (2 peers) and a tree (up to 4 peers) on 16-32 channels hold 0.3-1.2 GiB of buffers, plus
    the work FIFO, the proxy state, the point-to-point channels that send/recv and all_to_all open, and on
    H100 NVSwitch nodes the NVLS buffers. Measured per-communicator figures on 8-GPU nodes run 0.5-1.6 GB
    (the figure the course's issue 29 quotes); 1 GiB is that range's middle, and it is set once here.
    A communicator of one rank has no peers and no channel buffers, but NCCL's own device code and state
    still load: :data:`NCCL_SOLO_BYTES` (560 MiB; measured 558 MiB of device memory for a 1-rank NCCL group
    and its first allreduce on the H200 above, NCCL 2.28.9).
  - :data:`CUDA_CONTEXT_BYTES` (768 MiB, measured as above) for every *other* process with a context on
    GPU 0: the notebook kernel (it may
    touch ``cuda:0``, e.g. ``rank_device()`` off the ranks), a second cluster started while the first one is
    alive (no notebook does it: :func:`ddlcourse.checks.notebook_clusters` says so, and a test checks it), a job
    launched beside the engines (notebook 24's Horovod timeline). Each such process on the
    GPU also holds its own communicators and model state (the caching allocator keeps its peak reserved).
  - second copies a notebook makes: notebook 24's ``torch.compile`` comparison keeps the eager DDP model and a
    compiled deep copy (weights, gradients, DDP's gradient buckets, the compiled graph's saved activations);
    notebook 22's traffic measurement at ``sweep_tokens`` tokens per rank (:func:`moe_traffic_bytes`).
  - the rank lines of the grids a notebook lays out: :mod:`ddlcourse.grid` makes one torch group per line of
    ranks and keeps it for the life of the cluster (a line met twice is one group), and with the device bound at
    ``init_process_group`` each group opens its NCCL communicator at once. GPU 0 holds every line through rank 0:
    the first k ranks of each subgroup, both axes of lab 4's ``dp x mp`` meshes (:data:`DRIVING_MESHES`) and of
    lab 2's spatial runs (:data:`SEISMIC_SPATIAL_RUNS`).
  - send/recv pairs: a ``send``/``recv`` outside ``batch_isend_irecv`` gets a communicator of its own per pair of
    peers, even where the group's communicator exists (torch's ProcessGroupNCCL keys them by the pair;
    github.com/pytorch/pytorch/issues/152220); batched ones use the group's. Rank 0 sends to rank 1 in notebooks
    15 and 16 (``parallel.model_parallel``), and to its replica's head rank in each of lab 4's meshes
    (``parallel.branches``). Notebooks 17, 18 and 21 and lab 2 batch theirs.
  - kernels left running: JupyterLab keeps a notebook's kernel alive until you shut it down. The kernels of
    notebooks 10 and 23 train on ``cuda:0`` (:data:`KERNELS_ON_GPU0`), so each one left running holds a CUDA
    context and its cached tensors on GPU 0 while later notebooks run: counted in every section, the worst case
    of both left running.
* **Host memory per node**: (data one rank holds + :data:`PROCESS_OVERHEAD` per process) times the ranks of
  that run on one node (nodes of :data:`GPUS_PER_NODE` GPUs). Sections that run in the notebook's own kernel
  (no cluster) hold their model state and activations on the host as well.
* **Disk**: the data sets a section's generators write (:func:`data_sets`), from their arrays' shapes and dtypes at
  the scale plus the headers of the files (``.npz`` per chunk of :mod:`ddlcourse.data.cache`, ``.npy`` per shard of
  notebook 27), all under the data cache (``$DDLCOURSE_DATA_DIR``, default ``~/.cache/ddlcourse/data``). The
  labs' data sets stay there between runs; notebook 27's scratch folders are deleted when it ends. Tested against
  the bytes the generators write at smoke scale.
* The budgets the tests hold the ``cluster`` profile to: :data:`GPU_BUDGET` per GPU, :data:`HOST_BUDGET`
  of host memory per rank. :data:`GPU_BUDGET` is what the smallest card the course supports gives a process:
  a 16 GB T4, on which CUDA reports 14.75 GiB with ECC on, its default (``deviceMemorySize: 14.75GiB`` in
  TensorFlow's log of four T4s, github.com/NVIDIA/DALI/issues/1813; ``nvidia-smi`` shows 15360 MiB,
  github.com/modal-labs/modal-client/pull/2797). A V100-SXM2-16GB gives more (``nvidia-smi``: 16384 MiB,
  github.com/huggingface/text-generation-inference/issues/866), and neither gives its process the nominal
  16 GiB: the CUDA context, counted apart below, comes out of it too.

Sections with no meaningful device memory are listed apart, with the reason (:data:`NO_DEVICE`).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ddlcourse import config, datapipe, federated, grid, hpsearch as hp, integrity, memory, storage
from ddlcourse import synthetic_bench as sb
from ddlcourse.cases import driving as driving_case, maize as maize_case, seismic as seismic_case
from ddlcourse.cases import topology as topology_case
from ddlcourse.data import cache, driving as driving_data, maize as maize_data, seismic as seismic_data
from ddlcourse.data import topology as topology_data
from ddlcourse.device import synchronize
from ddlcourse.memory import SavedTensors
from ddlcourse.models import maize as maize_models, seismic as seismic_models, transformer as tf
from ddlcourse.models.driving import MultiViewNet
from ddlcourse.models.small import MLP, SmallCNN
from ddlcourse.models.topology import UNet
from ddlcourse.models.transformer import expert_capacity
from ddlcourse.experiments import model_parallel as mp_exp, pipeline_schedules as schedules_exp, sharded as sharded_exp

GiB = 2 ** 30
GPU_BUDGET = 1475 * GiB // 100   # 14.75 GiB: what CUDA gives a process on a 16 GB T4, the smallest card supported
HOST_BUDGET = 64 * GiB           # host memory per rank (a node of 8 GPUs with 512 GB)
GPUS_PER_NODE = 8                # the allocation env/slurm/README.md and env/GPU_CLUSTER.md document
MiB = 2 ** 20
CUDA_CONTEXT_BYTES = 768 * MiB   # a process's CUDA context with torch, cuDNN and cuBLAS loaded (measured, below)
WORKSPACE_BYTES = 5 * GiB // 4   # cuDNN/cuBLAS workspaces and allocator slack inside the caching allocator (below)
CUDA_OVERHEAD = CUDA_CONTEXT_BYTES + WORKSPACE_BYTES   # per GPU, on top of the workload's tensors
NCCL_COMM_BYTES = 1 * GiB        # one NCCL communicator of 2+ ranks on an 8-GPU node (see the module docstring)
NCCL_SOLO_BYTES = 560 * MiB      # one NCCL communicator of 1 rank: no peers, but NCCL's device code (measured)
PROCESS_OVERHEAD = 3 * GiB       # Python, torch, CUDA runtime and MPI buffers on the host, per process

# tensors of the parameters' size kept per parameter; "soap" adds its preconditioner matrices (see below)
OPT_STATES = {"none": 0, "sgd": 0, "momentum": 1, "lars": 1, "adam": 2, "adamw": 2, "lamb": 2, "soap": 2}

# sections that hold no meaningful device memory, and why
NO_DEVICE = {
    "setup_check": "allreduces a vector of vector_len floats three ways; nothing else",
    "collectives": "numpy buffers through mpi4py, on the host only: at most 3 buffers of 2**max_log2 bytes "
                   "per rank (0.75 GiB at cluster scale)",
    "comm_runtimes": "allreduce buffers of at most 2**max_log2 bytes and a model_mb gradient, on the host "
                     "(gloo and MPI on CPU tensors)",
    "param_server": "torch.distributed.rpc moves CPU tensors: the server and workers hold a small MLP on the host",
}


# =========================================================================== what a workload is
@dataclass
class Workload:
    """One thing one rank runs: a model, its per-rank batch, the loss, the optimizer and the data it holds."""
    label: str
    ranks: int                                   # ranks of this run (for the host memory of a node)
    model: Callable[[], nn.Module]               # builds the model (called under torch.device("meta"))
    batch: Callable[[str], tuple]                # device -> (inputs, target): the per-rank batch
    loss: Callable = None                        # (output, target) -> scalar; default cross-entropy
    optimizer: str = "adam"
    data_bytes: float = 0.0                      # host bytes of data this rank holds during the run
    on_host: bool = False                        # runs in the notebook kernel: model state on the host too
    prepare: Callable | None = None              # optional: model -> model (e.g. a halo slab), on meta
    measured: bool = False                       # data-dependent shapes (MoE routing) have no meta value:
                                                 # run it for real on the CPU (small models only)


@dataclass
class Estimate:
    section: str
    workload: str
    ranks: int
    ranks_per_node: int
    params: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    other: int
    data_per_rank: float
    host_per_rank: float
    host_per_node: float
    on_host: bool
    batch: str
    overhead: int = 0                            # communicators, other contexts, second copies (Overheads)
    overhead_why: str = ""

    @property
    def gpu_total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations + self.other + self.overhead

    @property
    def state(self) -> int:
        """The workload's own device memory without the CUDA overhead (a second process running it holds this)."""
        return self.weights + self.grads + self.optimizer + self.activations + self.other - (
            0 if self.on_host else CUDA_OVERHEAD)


# =========================================================================== the estimators
def _state_bytes(model: nn.Module, optimizer: str) -> int:
    if optimizer not in OPT_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; the planner knows {', '.join(OPT_STATES)}")
    total = 0
    for p in model.parameters():
        total += OPT_STATES[optimizer] * p.numel() * p.element_size()
        if optimizer == "soap":                 # two d x d matrices (statistics, eigenbasis) per dimension
            total += sum(2 * d * d for d in p.shape if d > 1) * p.element_size()
    return total


def saved_tensor_bytes(model: nn.Module, inputs, target, loss_fn=None) -> tuple[int, int]:
    """``(bytes, largest)`` of the tensors autograd saves for backward in ``loss_fn(model(*inputs), target)``.

    Works on meta tensors (an estimate, nothing allocated) and on real ones (a measurement). Each storage is
    counted once; the parameters' storages are left out; the batch (``inputs``, ``target``) is counted once
    whether or not autograd saves it.
    """
    loss_fn = loss_fn or F.cross_entropy
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    saved = SavedTensors(skip=model.parameters())
    saved.add(*inputs, target)
    with saved:
        loss_fn(model(*inputs), target)
    return saved.bytes, saved.largest


def _meta_model(build: Callable[[], nn.Module]) -> nn.Module:
    """The model with meta parameters: built under ``torch.device("meta")`` (nothing allocated), or, for a
    builder that moves its model to a real device itself, built there and then moved to meta."""
    try:
        with torch.device("meta"):
            model = build()
    except NotImplementedError:                  # "Cannot copy out of meta tensor": the builder calls .to(device)
        model = build()
    return model.to("meta")


def estimate(section: str, w: Workload) -> Estimate:
    """The memory of one rank running ``w`` (see the module docstring)."""
    model = w.model() if w.measured else _meta_model(w.model)
    if w.prepare is not None:
        model = w.prepare(model)
    inputs, target = w.batch("cpu" if w.measured else "meta")
    act, largest = saved_tensor_bytes(model, inputs, target, w.loss)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = weights                                                # backward fills every .grad
    opt = _state_bytes(model, w.optimizer)
    other = 2 * largest + (0 if w.on_host else CUDA_OVERHEAD)
    host = w.data_bytes + PROCESS_OVERHEAD + ((weights + grads + opt + act + 2 * largest) if w.on_host else 0)
    per_node = min(w.ranks, GPUS_PER_NODE)
    shapes = inputs if isinstance(inputs, tuple) else (inputs,)
    return Estimate(section=section, workload=w.label, ranks=w.ranks, ranks_per_node=per_node,
                    params=sum(p.numel() for p in model.parameters()), weights=weights, grads=grads,
                    optimizer=opt, activations=act, other=other, data_per_rank=float(w.data_bytes),
                    host_per_rank=float(host), host_per_node=float(host * per_node), on_host=w.on_host,
                    batch="x".join(str(d) for d in shapes[0].shape))


# =========================================================================== batches and losses
def _cls(batch: int, *shape, n_classes: int = 10, dtype=torch.float32):
    """A classification batch: inputs (batch, *shape), integer labels (batch,)."""
    def make(device):
        return (torch.zeros(batch, *shape, device=device, dtype=dtype),
                torch.zeros(batch, dtype=torch.long, device=device))
    return make


def _dense(batch: int, in_shape, tgt_shape, tgt_dtype=torch.float32):
    """A dense-prediction batch: inputs (batch, *in_shape), per-pixel targets (batch, *tgt_shape)."""
    def make(device):
        return (torch.zeros(batch, *in_shape, device=device),
                torch.zeros(batch, *tgt_shape, device=device, dtype=tgt_dtype))
    return make


def _mse(out, target):
    return F.mse_loss(out, target)


def _bce(out, target):
    return F.binary_cross_entropy_with_logits(out, target)


F32, I64 = 4, 8


# =========================================================================== one function per section
def _mlp(dim, n_classes, hidden, depth=2, dtype=torch.float32):
    return lambda: MLP(dim, n_classes, hidden=hidden, depth=depth).to(dtype)


def _sgd(s):            # notebook 01: runs in the kernel
    n = s.torch_samples
    return [Workload("torch loop", 1, _mlp(16, 4, 64), _cls(s.torch_batch, 16, n_classes=4), optimizer="momentum",
                     data_bytes=n * (16 * F32 + I64), on_host=True)]


def _batch_size(s):     # notebook 02: runs in the kernel
    n_par = sum(p.numel() for p in MLP(16, 4, hidden=64).parameters())
    data = (s.n_train + s.n_test) * (16 * F32 + I64)
    per_example = s.n_train * n_par * (F32 + 8 + 8)      # per-example grads, their float64 copy, the centred copy
    b = max(max(s.batch_sizes), max(s.noise_batches), max(s.gap_batches), max(s.rule_batches))
    return [Workload(f"batch {b}", 1, _mlp(16, 4, 64), _cls(b, 16, n_classes=4), optimizer="momentum",
                     data_bytes=data, on_host=True),
            Workload("per-example gradients", 1, _mlp(16, 4, 64), _cls(b, 16, n_classes=4), optimizer="momentum",
                     data_bytes=data + per_example, on_host=True)]


def _loss_integrity(s):
    def model(bn):
        return lambda: integrity.build_model(integrity.make_config(batchnorm=bn))
    cfg = integrity.make_config()
    data = s.n_samples * (cfg.dim * 8 + I64)
    out = []
    for k in (1, s.n_ranks):
        mb = max(s.micro_batch, math.ceil(s.global_batch / k))
        out.append(Workload(f"{k} rank(s)", k, model(True), _cls(mb, cfg.dim, n_classes=cfg.n_classes,
                                                                  dtype=torch.float64),
                            optimizer="momentum", data_bytes=data))
    return out


def _data_parallel(s):
    data = s.n_train * (s.dim * F32 + I64)
    return [Workload("train_way", s.n_ranks, _mlp(s.dim, 4, s.hidden), _cls(s.global_batch, s.dim, n_classes=4),
                     optimizer="adam", data_bytes=data),      # the serial reference: the whole global batch
            Workload("time_way", s.n_ranks, _mlp(64, 10, s.bench_hidden, s.bench_depth),
                     _cls(s.bench_batch, 64), optimizer="momentum", data_bytes=data)]


def _sync_batchnorm(s):
    img = s.image_size ** 2
    data = (s.n_train + s.n_test) * (img * F32 + I64)
    stat = s.n_train * s.width * img * F32                  # the kernel's first-layer activations of all images
    gb = s.micro_batch * s.n_ranks
    return [Workload("serial reference", s.n_ranks, lambda: SmallCNN(1, 3, s.width), _cls(gb, 1, s.image_size,
                     s.image_size, n_classes=3), optimizer="momentum", data_bytes=data),
            Workload("kernel: batch statistics", 1, lambda: SmallCNN(1, 3, s.width),
                     _cls(s.micro_batch, 1, s.image_size, s.image_size, n_classes=3), optimizer="none",
                     data_bytes=data + stat, on_host=True)]


def _large_batch(s):
    data = (s.n_train + 1024) * (s.dim * F32 + I64)
    b = max(s.global_batches)                               # one process trains a whole global batch
    return [Workload(f"batch {b}, {o}", s.n_ranks, _mlp(s.dim, 4, s.hidden), _cls(b, s.dim, n_classes=4),
                     optimizer=o, data_bytes=data) for o in ("adam", "soap")]


def _scaling(s):
    out = []
    for label, b, k in (("weak", s.batch_size, s.n_ranks), ("strong, 1 rank", s.strong_global_batch, 1)):
        out.append(Workload(label, k, lambda: sb.build_model(s.model, s.image_size, s.width),
                            _cls(b, 3, s.image_size, s.image_size), optimizer="momentum"))
    return out


def _memory(s):         # notebook 14: runs in the kernel
    v = max(s.volume_sizes)
    return [Workload("mlp", 1, lambda: memory.mlp(s.dim, s.hidden, s.depth), _cls(s.batch, s.dim, n_classes=4),
                     optimizer="adam", on_host=True),
            Workload(f"volume {v}^3", 1, lambda: memory.conv_net(1, 8, 3, ndim=3), _cls(1, 1, v, v, v, n_classes=3),
                     optimizer="sgd", on_host=True)]


def _model_parallel(s):
    return [Workload("serial reference", s.n_ranks, lambda: mp_exp.demo_model(n_layers=s.n_layers),
                     _cls(s.batch, 16, n_classes=4), optimizer="none", data_bytes=s.batch * (16 * F32 + I64))]


def _pipeline(s):
    return [Workload("serial reference", s.n_ranks, lambda: mp_exp.demo_model(n_layers=s.n_layers),
                     _cls(s.global_batch, 16, n_classes=4), optimizer="none",
                     data_bytes=s.global_batch * (16 * F32 + I64))]


def _tensor_spatial_sharded(s):
    return [Workload("sharded: serial Adam", s.n_ranks, lambda: sharded_exp.make_model(32, s.sharded_hidden,
                                                                                  s.sharded_depth),
                     _cls(32, 32, n_classes=4), optimizer="adam"),
            Workload("tensor parallel", s.n_ranks, _mlp(16, 4, s.hidden), _cls(8, 16, n_classes=4), optimizer="none")]


def _federated(s):
    data = (s.n_train + 1000) * (federated.DIM * F32 + I64)
    return [Workload("centralized", s.n_ranks, lambda: federated._model(0, 32),
                     _cls(s.batch_size, federated.DIM, n_classes=federated.N_CLASSES), optimizer="sgd",
                     data_bytes=data)]


def _data_pipeline(s):  # notebook 27: the kernel reads every rank's share
    data = s.n_samples * (s.image_size ** 2 * F32 + I64)
    return [Workload("kernel loop", 1, lambda: SmallCNN(1, 3, s.width), _cls(s.batch_size, 1, s.image_size,
                     s.image_size, n_classes=3), optimizer="momentum", data_bytes=data, on_host=True)]


def _hp_search(s):
    t = hp.TASK
    b = max(s.grid_batches)
    return [Workload(f"trial, batch {b}", s.n_engines, _mlp(t["dim"], t["n_classes"], t["hidden"], t["depth"]),
                     _cls(b, t["dim"], n_classes=t["n_classes"]), optimizer="momentum",
                     data_bytes=(t["n_train"] + t["n_val"]) * (t["dim"] * F32 + I64))]


def _perfmodel(s):
    return [Workload("compute timing", s.n_ranks, lambda: SmallCNN(1, 3, 16),
                     _cls(s.micro_batch, 1, s.image, s.image, n_classes=3), optimizer="none",
                     data_bytes=2 * max(s.allreduce_bytes))]


def _maize(s):
    n_ranks = s.n_engines
    R = s.n_rows * s.n_slots + maize_data.MAX_WEEDS         # plant records per image
    px = s.size ** 2
    per_img = px * (3 + 4 + 3 * F32 + 4 * F32) + R * s.crop ** 2 * (3 + 3 * F32) + R * 6 * F32
    n_chunks = s.n_train // s.chunk_size
    gb = n_chunks * s.per_chunk
    out = []
    for k in (1, n_ranks):                                  # the 1-rank point of the strong-scaling run
        mb = gb // k
        data_b = (s.n_train // k) * per_img + (s.n_val // k) * px * (3 + 4 + 3 * F32)
        out.append(Workload(f"segmentation, {k} rank(s)", k, lambda: maize_models.UNet(s.width, s.depth),
                            _dense(mb, (3, s.size, s.size), (4, s.size, s.size)), maize_models.seg_loss, "adam",
                            data_b))
        out.append(Workload(f"autoencoder, {k} rank(s)", k,
                            lambda: maize_models.CropAutoencoder(s.latent, s.ae_width, s.crop),
                            _dense(mb * R, (3, s.crop, s.crop), (3, s.crop, s.crop)), _mse, "adam", data_b))
    return out


def _seismic(s):
    vol = math.prod(s.volume)
    cube = math.prod(s.cube)
    train = math.ceil(s.n_volumes / s.n_ranks) * s.cubes_per_volume * cube * (F32 + 1)
    test = math.ceil(s.n_test / s.n_ranks) * vol * (F32 + 1)
    making = vol * (8 + 8 + 1)                              # one volume being generated (float64 work arrays)
    data_b = train + test + making

    def cube_model():
        return seismic_models.cube_model(s.width, s.levels, seismic_data.N_FACIES)

    def halo(model):                                        # one slab of a spatial split, zeros for the halo
        for blk in model.modules():
            if isinstance(blk, seismic_models.ConvReLU):
                blk._spatial = (seismic_models.ZeroHaloConv(blk.conv),)
        return model

    d, x, y = s.cube
    sd, sx, sy = s.spatial_cube
    return [Workload("3-D, one cube", s.n_ranks, cube_model, _dense(1, (1, d, x, y), (d, x, y), torch.long),
                     optimizer="adam", data_bytes=data_b),
            Workload("2-D sections of a cube", s.n_ranks,
                     lambda: seismic_models.section_model(s.width, s.levels, seismic_data.N_FACIES),
                     _dense(x, (1, d, y), (d, y), torch.long), optimizer="adam", data_bytes=data_b),
            Workload("spatial cube, spatial=2", 2, cube_model, _dense(1, (1, sd // 2, sx, sy), (sd // 2 + 2, sx, sy),
                     torch.long), loss=_halo_ce, optimizer="adam", data_bytes=data_b, prepare=halo),
            Workload("spatial cube, 1 rank (budget lifted)", 1, cube_model,
                     _dense(1, (1, sd, sx, sy), (sd, sx, sy), torch.long), optimizer="adam",
                     data_bytes=s.n_volumes * s.cubes_per_volume * cube * (F32 + 1) + test + making)]


def _halo_ce(out, target):
    return F.cross_entropy(out, target[:, : out.shape[2]])


def _topology(s):
    C = 5                                                  # 2-D inputs: volfrac, f_x, f_y, fixed_x, fixed_y
    grid = s.ny * s.nx
    per = grid * (C + 1) * F32 + 16 * 8                     # inputs, target, compliance and parameters
    data_b = (s.n_train + s.n_val) * per                    # data.gather: the whole set on every rank
    fine = (2 * s.n_fine) * 4 * per
    k_opt = min(2, s.n_ranks)                               # the notebook's optimizer study runs on 2 ranks

    def model():
        return UNet(in_ch=C, width=s.width, depth=s.depth, dim=2)
    out = []
    for label, mb, k, shape, dat in (
            ("main run", s.global_batch // s.n_ranks, s.n_ranks, (s.ny, s.nx), data_b),
            ("strong scaling, 1 rank", s.global_batch, 1, (s.ny, s.nx), data_b),
            (f"optimizers, batch {max(s.opt_batches)} on {k_opt} ranks", max(s.opt_batches) // k_opt, k_opt,
             (s.ny, s.nx), data_b),
            (f"fine grid, batch {s.n_fine} on {k_opt} ranks", s.n_fine // k_opt, k_opt, (2 * s.ny, 2 * s.nx),
             data_b + fine)):
        for opt in ("adam", "soap"):
            out.append(Workload(f"{label}, {opt}", k, model, _dense(mb, (C, *shape), (1, *shape)), _bce, opt, dat))
    return out


def _driving(s):
    clip = 3 * s.frames * s.size ** 2 * 2                  # three views, float16 on the host
    out = []
    for label, k in (("main run", s.n_ranks), ("strong scaling, 1 rank", 1)):
        mb = s.global_batch // k
        data_b = math.ceil(s.n_clips / k) * clip + math.ceil(s.n_val / k) * clip + mb * clip * 2   # + a float32 batch
        # a rank's share of a step goes through in micro_batches pieces (gradients accumulated): one piece's
        # activations at a time
        out.append(Workload(label, k, lambda: MultiViewNet(3, s.width, s.feat, s.hidden),
                            _cls(mb // s.micro_batches, 3, s.frames, s.size, s.size, n_classes=3), optimizer="adamw",
                            data_bytes=data_b))
    return out


def _transformer(s, batch: int, seq: int, dim: int, heads: int, layers: int, experts: int = 0, top_k: int = 2):
    cfg = tf.TransformerConfig(seq_len=seq, dim=dim, n_heads=heads, n_layers=layers, n_experts=experts, top_k=top_k)

    def tokens(device):
        return (torch.zeros(batch, seq, dtype=torch.long, device=device),
                torch.zeros(batch, seq, dtype=torch.long, device=device))
    return lambda: tf.Transformer(cfg), tokens, tf.lm_loss


def _tensor_sequence_parallel(s):
    out = []
    for label, b, seq, dim, heads, layers in (("training, serial reference", s.batch, s.seq_len, s.dim, s.n_heads,
                                                s.n_layers),
                                               ("memory check, one block", s.mem_batch, s.mem_seq, s.mem_dim,
                                                s.mem_heads, 1)):
        model, batch, loss = _transformer(s, b, seq, dim, heads, layers)
        out.append(Workload(label, s.n_ranks, model, batch, loss=loss, optimizer="adam"))
    return out


def _context_parallel(s):
    model, batch, loss = _transformer(s, s.batch, s.seq_len, s.dim, s.n_heads, s.n_layers)
    mem, mbatch, _ = _transformer(s, 1, s.mem_seq, s.dim, s.n_heads, 1)   # the whole sequence on one rank
    return [Workload("training, serial reference", s.n_ranks, model, batch, loss=loss, optimizer="adam"),
            Workload(f"memory check, length {s.mem_seq} on one rank", s.n_ranks, mem, mbatch, loss=loss,
                     optimizer="adam")]


def _expert_parallel(s):
    experts = s.experts_per_rank * s.n_ranks
    model, batch, loss = _transformer(s, s.batch, s.seq_len, s.dim, 4, 2, experts=experts, top_k=s.top_k)
    return [Workload("MoE training (measured, CPU)", s.n_ranks, model, batch, loss=loss,
                     optimizer="adam", measured=True)]


def _sizing_layout(s):
    model, batch, loss = _transformer(s, s.batch, s.seq_len, s.dim, s.n_heads, 2)
    return [Workload("calculator check, serial", s.n_ranks, model, batch, loss=loss, optimizer="adam")]


def _small_mlp(label: str, ranks: int, dim: int, hidden: int, batch: int, optimizer: str = "adam"):
    return [Workload(label, ranks, _mlp(dim, 4, hidden), _cls(batch, dim, n_classes=4), optimizer=optimizer)]


def _mixed_precision(s):     # amp.make_problem: x (n, 16) and y (n, 1)
    return [Workload("fp32 reference run", s.n_ranks, _mlp(16, 4, 64), _cls(s.n, 16, n_classes=4), optimizer="sgd",
                     data_bytes=s.n * (16 + 1) * F32)]


def _fault_tolerance(s):
    return _small_mlp("DDP training", s.n_ranks, 16, s.hidden, 64)


def _native_sharding(s):
    return _small_mlp("serial reference", s.n_load, s.dim, s.hidden, s.global_batch)


def _profiling(s):      # notebook 24: the profiled DDP step (the compile comparison adds a second copy)
    return [Workload("profiled DDP step", s.n_ranks, _mlp(s.dim, 10, s.hidden, s.depth), _cls(s.batch, s.dim),
                     optimizer="sgd")]


def _pipeline_schedules(s):  # notebook 17: every rank also builds the whole model as the serial reference
    return [Workload("serial reference", s.n_ranks,
                     lambda: schedules_exp.build_model(2 * s.n_ranks, s.dim, s.layers_per_rank // 2),
                     _dense(s.global_batch, (s.dim,), (s.dim,)), loss=_mse, optimizer="none",
                     data_bytes=2 * s.global_batch * s.dim * F32)]


SECTIONS: dict[str, Callable] = {
    "sgd": _sgd, "batch_size": _batch_size, "loss_integrity": _loss_integrity, "data_parallel": _data_parallel,
    "sync_batchnorm": _sync_batchnorm, "large_batch": _large_batch, "scaling": _scaling, "memory": _memory,
    "model_parallel": _model_parallel, "pipeline": _pipeline, "tensor_spatial_sharded": _tensor_spatial_sharded,
    "federated": _federated, "data_pipeline": _data_pipeline, "hp_search": _hp_search, "perfmodel": _perfmodel,
    "lab_maize": _maize, "lab_seismic": _seismic, "topology": _topology, "lab_driving": _driving,
    "tensor_sequence_parallel": _tensor_sequence_parallel, "context_parallel": _context_parallel,
    "expert_parallel": _expert_parallel, "sizing_layout": _sizing_layout, "mixed_precision": _mixed_precision,
    "fault_tolerance": _fault_tolerance, "native_sharding_checkpoints": _native_sharding,
    "pipeline_schedules": _pipeline_schedules, "profiling": _profiling,
}

# the layouts the labs' notebooks run (tests/test_plan_gpu_overheads.py reads them from the notebooks)
DRIVING_MESHES = (2, 4)                          # lab 4: mp of its "2 x 2 (mesh)" and "1 x 4 (views)", on all ranks
SEISMIC_SPATIAL_RUNS = ((2, 2), (4, 2), (4, 4))  # lab 2's big-cube runs: (ranks, spatial)
SEISMIC_BIG_RUN = dict(n_volumes=4, cubes_per_volume=2)   # and their data set (of spatial_cube cubes)

# notebooks whose kernel trains on cuda:0 (rank_device() off the ranks): section -> (notebook, the planned workload
# it runs there); a kernel left running keeps its context and its cached tensors on GPU 0
KERNELS_ON_GPU0 = {"federated": (10, "centralized"), "mixed_precision": (23, "fp32 reference run")}


# =========================================================================== disk: the data sets a section writes
U8, I16, I32, F16, F64 = 1, 2, 4, 2, 8
NPY_HEADER_BYTES = 128                    # np.save: the header of an array's .npy file
NPZ_ENTRY_BYTES = NPY_HEADER_BYTES + 96   # np.savez, per array: its .npy header and the zip's local (30, and 20 of
                                          # zip64) and central (46) headers; each holds the name too (added below)
NPZ_END_BYTES = 22                        # np.savez, per file: the zip's end record


@dataclass
class DataSet:
    """One data set a section writes under the data cache (``$DDLCOURSE_DATA_DIR``)."""
    label: str
    bytes: int                   # estimated from the generator's arrays at the scale, file headers included
    make: Callable[[], object]   # writes it as the notebook or lab does (the tests run it at smoke scale)
    kept: bool = True            # False: a scratch folder the notebook deletes when it ends


def _cached(label: str, n_items: int, chunk_size: int, item: dict, make: Callable) -> DataSet:
    """A data set of :mod:`ddlcourse.data.cache`: ``n_items`` items, one ``.npz`` file per chunk of ``chunk_size``
    holding the arrays of ``item`` (array name -> bytes per item)."""
    per_file = sum(NPZ_ENTRY_BYTES + 2 * len(f"{name}.npy") for name in item) + NPZ_END_BYTES
    return DataSet(label, n_items * sum(item.values()) + cache.n_chunks(n_items, chunk_size) * per_file, make)


def _maize_disk(s):     # lab 1: the training field and the validation tiles (ddlcourse.data.maize.load)
    cfg = maize_case.Config.make(s.scale)
    px, records = cfg.size ** 2, cfg.n_rows * cfg.n_slots + maize_data.MAX_WEEDS
    item = {"image": px * 3 * U8, "instances": px * I16, "plants": records * len(maize_data.REC_FIELDS) * F32,
            "chunk": I32}
    train, val = maize_case.train_settings(cfg), maize_case.val_settings(cfg)
    return [_cached(f"field, {cfg.n_train} tiles", cfg.n_train, cfg.chunk_size, item, lambda: maize_data.load(train)),
            _cached(f"validation, {cfg.n_val} tiles", cfg.n_val, cfg.val_chunk_size, item,
                    lambda: maize_data.load(val))]


def _seismic_disk(s):   # lab 2: training cubes, the big cubes of the spatial runs, held-out volumes
    cfg = seismic_case.Config.make(s.scale)

    def cubes(n_volumes, cube, per_volume):
        v = math.prod(cube)
        return _cached(f"{n_volumes} x {per_volume} cubes {tuple(cube)}", n_volumes * per_volume, per_volume,
                       {"seismic": v * F32, "labels": v * U8, "chunk": I64},
                       lambda: seismic_data.training_cubes(n_volumes, cfg.volume, cube, per_volume, cfg.seed))
    big = SEISMIC_BIG_RUN
    v = math.prod(cfg.volume)
    return [cubes(cfg.n_volumes, cfg.cube, cfg.cubes_per_volume),
            cubes(big["n_volumes"], cfg.spatial_cube, big["cubes_per_volume"]),
            _cached(f"{cfg.n_test} held-out volumes", cfg.n_test, 1, {"seismic": v * F32, "labels": v * U8},
                    lambda: seismic_data.test_volumes(cfg.n_test, cfg.volume, seed=cfg.seed + 10_000))]


def _topology_disk(s):  # lab 3: solved designs on the coarse grid and on the fine one (twice as fine)
    out = []
    for grid_name, cfg in (("coarse", topology_case.Config.make(s.scale)),
                           ("fine", topology_case.Config.make(s.scale, resolution=2, n_train=s.n_fine,
                                                              n_val=s.n_fine, global_batch=s.n_fine))):
        cells = math.prod(cfg.shape)
        item = {"inputs": (2 * len(cfg.shape) + 1) * cells * F32, "target": cells * F32, "compliance": F64,
                "params": len(topology_data.PARAMS) * F64, "n_iter": I32}
        for split in ("train", "val"):
            st = cfg.data_settings(split)
            out.append(_cached(f"{grid_name} {split}, {st['n_items']} designs", st["n_items"], st["chunk_size"],
                               item, lambda st=st: topology_data.load(st)))
    return out


def _driving_disk(s):   # lab 4: training and validation clips, three float16 views each (cases.driving.load_data)
    cfg = driving_case.Config.make(s.scale)
    item = {"video": len(driving_data.VIEWS) * cfg.frames * cfg.size ** 2 * F16, "label": I64, "scenario": I64,
            "min_ttc": F32}
    return [_cached(f"{label}, {n} clips", n, driving_data.CHUNK, item,
                    lambda n=n, seed=seed: driving_data.generate(n, cfg.frames, cfg.size, seed=seed))
            for label, n, seed in (("training", cfg.n_clips, cfg.seed), ("validation", cfg.n_val, cfg.seed + 10_000))]


def _data_pipeline_disk(s):   # notebook 27: its shards and the contention files, in scratch folders it deletes
    shards = math.ceil(s.n_samples / s.samples_per_shard)
    mb = int(s.contention_mb * 2 ** 20)
    return [DataSet(f"shards, {s.n_samples} samples", s.n_samples * (s.image_size ** 2 * F32 + I64)
                    + shards * 2 * NPY_HEADER_BYTES,
                    lambda: datapipe.convert(datapipe.shapes_chunks(s.n_samples, size=s.image_size),
                                             datapipe.scratch_dir("shapes"), s.samples_per_shard), kept=False),
            DataSet(f"contention files, {s.n_ranks} ranks", 2 * s.n_ranks * mb,
                    lambda: storage.make_contention_files(datapipe.scratch_dir("contention"), s.n_ranks,
                                                          s.contention_mb), kept=False)]


DISK: dict[str, Callable] = {"lab_maize": _maize_disk, "lab_seismic": _seismic_disk, "topology": _topology_disk,
                             "lab_driving": _driving_disk, "data_pipeline": _data_pipeline_disk}


def data_sets(section: str, scale: str | None = None) -> list[DataSet]:
    """The data sets ``section`` writes to disk at ``scale`` (none for most notebooks: their data is made in memory)."""
    return DISK[section](config.sizes(section, scale)) if section in DISK else []


# =========================================================================== communicators, contexts, copies
@dataclass
class Overheads:
    """What GPU 0 holds for a section besides its workload (see the module docstring)."""
    groups: list                  # rank counts of the NCCL communicators local rank 0 holds (world first)
    contexts: int = 1             # CUDA contexts of *other* processes on GPU 0 (default: the notebook kernel)
    copies: list = None           # (label, bytes): second copies, co-resident processes' state, measurements
    pairs: int = 0                # 2-rank communicators of rank 0's send/recv outside batch_isend_irecv

    @property
    def communicators(self) -> int:
        return len(self.groups) + self.pairs

    @property
    def nccl_bytes(self) -> int:
        return sum(NCCL_COMM_BYTES if k > 1 else NCCL_SOLO_BYTES for k in self.groups) + self.pairs * NCCL_COMM_BYTES

    @property
    def bytes(self) -> int:
        return self.nccl_bytes + self.contexts * CUDA_CONTEXT_BYTES + sum(b for _, b in self.copies or [])

    def why(self) -> str:
        parts = [f"{len(self.groups)} NCCL communicator(s) of {'/'.join(map(str, self.groups))} ranks"]
        parts += [f"{self.pairs} send/recv pair(s) of 2 ranks"] if self.pairs else []
        parts += [f"{self.contexts} other CUDA context(s)"]
        parts += [f"{label} {_g(b)} GiB" for label, b in self.copies or []]
        return ", ".join(parts)


def _groups(n: int, subgroups=(), mesh_dims: int = 0, horovod: bool = False, meshes=()) -> list:
    """World (n ranks), one per distinct rank line through rank 0 of :mod:`ddlcourse.grid` (the first k ranks of
    every ``dist.subgroup(k)``, both axes of every ``(ranks, mp)`` mesh of ``meshes``), one per dimension of a
    ``dcp.mesh_2d``, Horovod's."""
    lines = {tuple(range(k)) for k in subgroups if 1 <= k <= n}
    for ranks, mp in meshes:                    # training.setup's dp x mp grid over the first `ranks` ranks
        g = grid.Grid(("dp", "mp"), (ranks // mp, mp), ranks, 0)     # rank 0's place in it
        lines |= {tuple(g.ranks(axis)) for axis in ("dp", "mp")}
    out = [n] + sorted(len(line) for line in lines)
    out += [max(2, n // 2)] * mesh_dims         # a (dp, tp) mesh of n ranks: groups of n/dp and dp ranks
    return out + ([n] if horovod else [])


def _scaling_ranks(n: int) -> tuple:
    """The 1, 2, 4, ... n rank points of a scaling experiment run on one cluster (training.run / subgroup)."""
    return tuple(k for k in (1, 2, 4, 8, 16, 32) if k <= n) + (n,)


def moe_traffic_bytes(tokens_per_rank: int, ep: int, dim: int, hidden: int, experts_per_rank: int, top_k: int,
                      capacity_factor: float = 2.0) -> int:
    """GPU bytes of one rank in ``expert.measure_traffic`` (notebook 22), worst case: every local expert full.

    Forward: the whole token set ``tokens_per_rank * ep x dim`` (every rank builds it, then slices its own),
    its slice and the slice's gradient, router logits and probabilities (3 tensors of tokens x experts), the
    dispatched rows ``x[tok]`` (tokens x top_k), the received rows (``local * ep * capacity`` at most), the
    expert MLP's hidden activations (2 of rows x hidden), ``out`` rebuilt once per local expert
    (``index_copy``), the combined rows and their gated copy, ``y``. Backward sends a gradient of the same
    size through each of them: the activations count twice. The experts themselves are small (listed apart).
    """
    E = experts_per_rank * ep
    local = experts_per_rank
    cap = expert_capacity(tokens_per_rank, E, top_k, capacity_factor)
    sent = tokens_per_rank * top_k
    recv = min(local * ep * cap, sent * ep)
    elems = (tokens_per_rank * ep * dim                     # the whole token set
             + 2 * tokens_per_rank * dim                    # this rank's slice and its gradient
             + 3 * tokens_per_rank * E                      # router logits, probabilities, top-k scratch
             + sent * dim                                   # x[tok]
             + recv * (dim + 2 * hidden)                    # received rows, expert hidden pre/post activation
             + (local + 1) * recv * dim                     # out, rebuilt per local expert
             + 2 * sent * dim + tokens_per_rank * dim)      # back, gated back, y
    act = elems * F32
    params = E * 2 * dim * hidden * F32 * 2                 # the serial MoE make_moe builds, with gradients
    return int(2 * act + params)


def _compiled_copy(e: "Estimate") -> int:
    """Notebook 24's compare_compile: a deep copy under torch.compile (weights, gradients, DDP's buckets, the compiled
    graph's saved activations) and the eager model's own DDP buckets."""
    return e.weights + 2 * e.grads + e.activations + e.grads


def _ov_default(s, ests) -> Overheads:
    return Overheads(_groups(getattr(s, "n_ranks", getattr(s, "n_engines", 1))))


def _ov_subgroups(sizes):
    def ov(s, ests):
        return Overheads(_groups(s.n_ranks, sizes(s)))
    return ov


def _ov_labs(horovod: bool = False):
    def ov(s, ests):
        n = getattr(s, "n_ranks", getattr(s, "n_engines", 1))
        return Overheads(_groups(n, _scaling_ranks(n), horovod=horovod))
    return ov


def _ov_profiling(s, ests) -> Overheads:
    e = max(ests, key=lambda x: x.gpu_total)
    n = s.n_ranks
    return Overheads(_groups(n, (1, n)) + [n],        # + the Horovod timeline job's own communicator
                     contexts=2,                       # the notebook kernel and the Horovod timeline job
                     copies=[("compiled copy (torch.compile)", _compiled_copy(e)),
                             ("Horovod timeline job's model", e.state)])


def _ov_expert(s, ests) -> Overheads:
    n = s.n_ranks
    traffic = moe_traffic_bytes(s.sweep_tokens, n, s.dim, s.hidden, s.experts_per_rank, s.top_k, 2.0)
    return Overheads(_groups(n, (n,)), copies=[(f"traffic measurement, {s.sweep_tokens} tokens per rank", traffic)])


def _ov_stages(s, ests) -> Overheads:
    # notebooks 15 and 16 on the first n ranks: stage 0 (rank 0) sends to stage 1 and receives from it, unbatched
    return Overheads(_groups(s.n_ranks, (s.n_ranks,)), pairs=1)


def _ov_seismic(s, ests) -> Overheads:
    return Overheads(_groups(s.n_ranks, _scaling_ranks(s.n_ranks), meshes=SEISMIC_SPATIAL_RUNS))


def _ov_driving(s, ests) -> Overheads:
    # every layout of the lab over all ranks; in each, rank 0 holds a view and sends its features to the head rank
    # of its replica (mp - 1), and receives their gradients from it: one send/recv pair per layout
    meshes = [(s.n_ranks, mp) for mp in DRIVING_MESHES]
    return Overheads(_groups(s.n_ranks, _scaling_ranks(s.n_ranks), meshes=meshes), pairs=len(DRIVING_MESHES))


def _ov_native(s, ests) -> Overheads:
    # one cluster at a time (notebook 26 stops c before c_save starts): c's world + its (dp, tp) mesh's 2 dimensions;
    # c_save's world alone is fewer, on fewer ranks, once c's processes and their communicators are gone
    return Overheads(_groups(s.n_load, mesh_dims=2))


OVERHEADS: dict[str, Callable] = {
    "loss_integrity": _ov_subgroups(lambda s: (1, 2, 4, s.n_ranks)),
    "data_parallel": lambda s, ests: Overheads(_groups(s.n_ranks, horovod=True)),
    "scaling": _ov_subgroups(lambda s: _scaling_ranks(s.n_ranks)),
    "model_parallel": _ov_stages,
    "pipeline": _ov_stages,
    "pipeline_schedules": _ov_subgroups(lambda s: (s.n_ranks,)),
    "tensor_spatial_sharded": _ov_subgroups(lambda s: (s.n_ranks,)),
    "federated": _ov_subgroups(lambda s: (s.n_ranks,)),
    "mixed_precision": _ov_subgroups(lambda s: (s.n_ranks,)),
    "sizing_layout": _ov_subgroups(lambda s: (s.n_ranks,)),
    "tensor_sequence_parallel": _ov_subgroups(lambda s: _scaling_ranks(s.n_ranks)),
    "context_parallel": _ov_subgroups(lambda s: _scaling_ranks(s.n_ranks)),
    "expert_parallel": _ov_expert,
    "profiling": _ov_profiling,
    "native_sharding_checkpoints": _ov_native,
    "lab_maize": _ov_labs(horovod=True),
    "lab_seismic": _ov_seismic, "topology": _ov_labs(), "lab_driving": _ov_driving,
}


def kernel_bytes(section: str, scale: str | None = None) -> int:
    """What the kernel of ``section``'s notebook keeps on cuda:0 besides its context: its training's model state,
    activations and data (all on the device)."""
    _, label = KERNELS_ON_GPU0[section]
    w = next(w for w in workloads(section, scale) if w.label == label)
    e = estimate(section, w)
    return e.state + int(e.data_per_rank)


def overheads(section: str, scale: str | None = None, ests: list | None = None) -> Overheads:
    """The communicators, other contexts and copies GPU 0 holds for ``section`` (default: the world's
    communicator and the notebook kernel's context), with the kernels of :data:`KERNELS_ON_GPU0` left running."""
    s = config.sizes(section, scale)
    if ests is None:
        ests = [estimate(section, w) for w in workloads(section, scale)]
    ov = OVERHEADS.get(section, _ov_default)(s, [e for e in ests if not e.on_host] or ests)
    for other, (notebook, _) in KERNELS_ON_GPU0.items():
        if other != section:                   # this notebook's own kernel is counted already
            ov.contexts += 1
        ov.copies = [*(ov.copies or []), (f"notebook {notebook}'s kernel left running", kernel_bytes(other, s.scale))]
    return ov


# =========================================================================== the plan
def workloads(section: str, scale: str | None = None) -> list[Workload]:
    if section not in SECTIONS:
        raise config.ScaleError(f"the planner has no section {section!r}; it plans {', '.join(SECTIONS)}")
    return SECTIONS[section](config.sizes(section, scale))


@dataclass
class Row:
    """One section: its ranks, the workload with the largest GPU total, the one with the most host memory per
    rank, the most host memory of one node over the workloads, and the data sets it writes to disk."""
    section: str
    ranks: int
    gpu: Estimate
    host: Estimate
    host_per_node: float
    disk: list                # the data sets it writes (DataSet)

    @property
    def disk_bytes(self) -> int:
        return sum(d.bytes for d in self.disk)

    def overshoot(self) -> list[str]:
        return overshoot(self.gpu, self.host)


def plan_section(section: str, scale: str | None = None) -> Row:
    ests = [estimate(section, w) for w in workloads(section, scale)]
    if any(not e.on_host for e in ests):          # a cluster section: GPU 0 also holds communicators, contexts ...
        ov = overheads(section, scale, ests)
        for e in ests:
            if not e.on_host:
                e.overhead, e.overhead_why = ov.bytes, ov.why()
    gpu = max(ests, key=lambda e: (not e.on_host, e.gpu_total))
    host = max(ests, key=lambda e: e.host_per_rank)
    return Row(section, max(e.ranks for e in ests), gpu, host, max(e.host_per_node for e in ests),
               data_sets(section, scale))


def plan(scale: str | None = None) -> list[Row]:
    missing = set(config.PROFILES) - set(SECTIONS) - set(NO_DEVICE)
    if missing:
        raise config.ScaleError(f"config.PROFILES has section(s) the planner does not know: {sorted(missing)}; "
                                "add them to plan.SECTIONS or plan.NO_DEVICE")
    return [plan_section(name, scale) for name in config.PROFILES if name in SECTIONS]


def overshoot(gpu: Estimate, host: Estimate) -> list[str]:
    """What does not fit the budgets, in words (empty when everything fits)."""
    out = []
    if not gpu.on_host and gpu.gpu_total > GPU_BUDGET:
        out.append(f"{gpu.section} ({gpu.workload}): {_g(gpu.gpu_total)} GiB per GPU, "
                   f"{_g(gpu.gpu_total - GPU_BUDGET)} GiB over the {_g(GPU_BUDGET)} GiB GPU")
    if host.host_per_rank > HOST_BUDGET:
        out.append(f"{host.section} ({host.workload}): {_g(host.host_per_rank)} GiB of host memory per rank, "
                   f"{_g(host.host_per_rank - HOST_BUDGET)} GiB over {_g(HOST_BUDGET)} GiB")
    return out


def _g(b: float) -> str:
    return f"{b / GiB:.2f}"


def _n(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


FOOTER = f"""\
GPU columns: GiB per GPU for the workload named, the one with the largest GPU total (its own ranks in brackets;
'ranks' is the most any workload of the section uses). Rows marked 'host' run in the notebook's kernel: their
model state and activations are host memory (the GPU columns show them; no GPU is used).
  weights, grads: parameters x bytes of their dtype. opt: SGD 0, momentum/LARS 1, Adam/AdamW/LAMB 2 tensors of the
    parameters' size; SOAP 2 + two d x d matrices per dimension d of each parameter.
  act: tensors autograd saves for backward (each storage once, parameters left out) plus the batch, from the real
    model's forward + loss on meta tensors of the per-rank batch shape (nothing allocated).
  other: 2 x the largest saved tensor (gradients in flight during backward) + {_g(CUDA_OVERHEAD)} GiB: CUDA context
    ({_g(CUDA_CONTEXT_BYTES)}), cuDNN/cuBLAS workspaces and allocator slack ({_g(WORKSPACE_BYTES)}), measured on an H200.
  comm+ctx: GPU 0's NCCL communicators ({_g(NCCL_COMM_BYTES)} GiB each, {_g(NCCL_SOLO_BYTES)} GiB for one of 1 rank: world,
    subgroups, the labs' grid lines, mesh dimensions, Horovod's; one more per pair of an unbatched send/recv),
    {_g(CUDA_CONTEXT_BYTES)} GiB per other process's CUDA context on it (notebook kernel, the kernels of notebooks
    10 and 23 left running on cuda:0, a second cluster or job) and second copies (those kernels' tensors,
    notebook 24's compiled model, notebook 22's traffic measurement).
  host/node: (data per rank + {_g(PROCESS_OVERHEAD)} GiB per process) x ranks of that run on one node of {GPUS_PER_NODE}
    GPUs, the largest over the section's workloads; data/rank: what one rank holds of the data set, for the
    workload with the most host memory per rank (a 1-rank point of a scaling run holds the whole set).
  disk: the data sets the section's generators write under the data cache ($DDLCOURSE_DATA_DIR), from their arrays'
    shapes and dtypes; the labs' stay there between runs, notebook 27 deletes its scratch folders when it ends.
Budgets: {_g(GPU_BUDGET)} GiB per GPU (what CUDA gives a process on a 16 GB T4, the smallest card the course
supports), {_g(HOST_BUDGET)} GiB of host memory per rank.
No meaningful device memory:
""" + "\n".join(f"  {k}: {v}" for k, v in NO_DEVICE.items())


def format_plan(rows: list[Row], scale: str) -> str:
    head = (f"{'section':<23}{'ranks':>5}  {'workload (its ranks)':<42}{'batch per rank':>18}{'params':>9}"
            f"{'weights':>8}{'grads':>7}{'opt':>7}{'act':>8}{'other':>7}{'comm+ctx':>9}{'total':>8}{'':5}{'host/node':>9}"
            f"{'data/rank':>10}{'disk':>7}  fits")
    lines = [f"scale profile: {scale}   (memory in GiB)", head, "-" * len(head)]
    for row in rows:
        g = row.gpu
        lines.append(
            f"{row.section:<23}{row.ranks:>5}  {(g.workload + f' ({g.ranks})')[:41]:<42}{g.batch:>18}{_n(g.params):>9}"
            f"{_g(g.weights):>8}{_g(g.grads):>7}{_g(g.optimizer):>7}{_g(g.activations):>8}{_g(g.other):>7}{_g(g.overhead):>9}"
            f"{_g(g.gpu_total):>8}{' host' if g.on_host else '':5}{_g(row.host_per_node):>9}"
            f"{_g(row.host.data_per_rank):>10}{_g(row.disk_bytes):>7}  {'NO' if row.overshoot() else 'yes'}")
    lines.append("-" * len(head))
    for row in rows:
        if row.gpu.overhead_why:
            lines.append(f"comm+ctx {row.section}: {row.gpu.overhead_why}")
    for row in rows:
        for b in row.overshoot():
            lines.append("OVER BUDGET: " + b)
    kept = sum(d.bytes for row in rows for d in row.disk if d.kept)
    scratch = max((sum(d.bytes for d in row.disk if not d.kept) for row in rows), default=0)
    lines.append(f"disk: {_g(kept)} GiB of data sets kept in the data cache {cache.cache_root()} "
                 f"($DDLCOURSE_DATA_DIR), and {_g(scratch)} GiB more while notebook 27 runs. On a cluster, not in "
                 "$HOME and its quota: set DDLCOURSE_DATA_DIR to a folder on scratch that every node sees "
                 "(env/slurm/README.md).")
    lines.append(FOOTER)
    return "\n".join(lines)


# =========================================================================== the estimate against a real GPU
@dataclass
class Measured:
    section: str
    workload: str
    estimated: int        # weights + grads + activations + the gradients in flight (2 x the largest saved tensor)
    peak: int             # what the caching allocator handed out over one forward and backward on the GPU
    budget: int           # what the plan gives it inside the allocator: estimated + WORKSPACE_BYTES

    @property
    def ratio(self) -> float:
        return self.peak / max(self.estimated, 1)

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget


def measure_workload(section: str, w: Workload, device) -> Measured:
    """One real forward and backward of ``w`` at its per-rank batch on the CUDA ``device``: the allocator's peak
    (parameters, gradients, saved activations, gradients in flight, cuDNN/cuBLAS workspaces) against the plan.

    The optimizer state is left out of both sides: its size is exact arithmetic (see :data:`OPT_STATES`), and
    what a GPU can show is whether the activation and workspace figures of :func:`estimate` hold."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"measuring the plan needs a CUDA device (got {dev}): the allocator's peak is the figure")
    est = estimate(section, w)
    synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.manual_seed(0)
    model = w.model().to(dev)
    if w.prepare is not None:
        model = w.prepare(model)
    inputs, target = w.batch(dev)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    (w.loss or F.cross_entropy)(model(*inputs), target).backward()
    synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - base
    del model, inputs, target
    estimated = est.state - est.optimizer          # the optimizer state is left out of both sides
    return Measured(section, w.label, estimated, peak, estimated + WORKSPACE_BYTES)


def measure(scale: str | None = None, device="cuda", sections=None, progress=print) -> list[Measured]:
    """:func:`measure_workload` for every GPU workload (not those that run in the notebook's kernel)."""
    out = []
    for section in sections or [name for name in config.PROFILES if name in SECTIONS]:
        for w in workloads(section, scale):
            if w.on_host:
                continue
            m = measure_workload(section, w, device)
            out.append(m)
            if progress:
                progress(f"measured {m.section:<28}{m.workload[:44]:<45} estimated {_g(m.estimated):>6} GiB  "
                         f"peak {_g(m.peak):>6} GiB  x{m.ratio:5.2f}  {'fits' if m.fits else 'OVER the plan'}")
    return out


def main_measure(scale: str | None = None) -> int:
    """``plan --measure``: every GPU workload once on this machine's GPU; exit 1 when one exceeds its plan."""
    scale = config.get_scale(scale)
    if not torch.cuda.is_available():
        print("python -m ddlcourse plan --measure: no CUDA device here; the measurement needs a GPU "
              "(env/gpu_smoke.sh runs it as the check 'plan')", file=sys.stderr)
        return 2
    got = measure(scale, "cuda:0", progress=lambda line: print(line, flush=True))
    over = [m for m in got if not m.fits]
    sized = [m for m in got if m.estimated >= GiB // 10] or got      # ratios of a few MiB say nothing
    worst = max(sized, key=lambda m: m.ratio)
    print(f"plan --measure ({scale}, {torch.cuda.get_device_name(0)}): {len(got)} workloads, {len(over)} over "
          f"their plan; peak/estimate from {min(m.ratio for m in sized):.2f} to {worst.ratio:.2f} over the "
          f"{len(sized)} of 0.1 GiB or more (highest: {worst.section}, {worst.workload})")
    return 1 if over else 0


def main(scale: str | None = None) -> int:
    """Print the plan; exit status 1 when something does not fit."""
    scale = config.get_scale(scale)
    rows = plan(scale)
    print(format_plan(rows, scale))
    return 1 if any(row.overshoot() for row in rows) else 0
