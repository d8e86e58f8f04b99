"""Where this process runs: its local rank on the host, its device, and launches that cannot train correctly.

The launcher (``mpiexec``, ``srun``, ipyparallel's engines) decides where each rank runs; this module reads what
it decided, from MPI and the launcher's own variables, without starting ``torch.distributed``. :func:`on_mpi_rank`
says whether this process is an MPI rank at all, :func:`local_rank` is the rank among the processes of this host,
:func:`pick_device` the GPU of that local rank (else the CPU), :func:`describe` one line of ``MPICluster.report``.
:mod:`ddlcourse.dist` builds a rank's setup on these, and refuses, with :class:`LaunchError`, a launch that would
train wrongly without a word (:func:`check_launch`, :func:`pick_device`, :func:`shared_gpu`).
"""
from __future__ import annotations

import os
import socket
import sys

_STATE: dict = {}


def _comm():
    from mpi4py import MPI      # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only
    return MPI.COMM_WORLD


class LaunchError(RuntimeError):
    """The processes were started in a way that cannot train correctly (wrong launcher or device setup)."""


# Launcher variables that give this process's rank among the processes of its host. Each is trusted only
# when the launcher's own rank/size variables beside it match the MPI world (an inherited variable does not).
_LOCAL_RANK_VARS = (
    # (local rank, world rank, world size)
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),   # Open MPI
    ("MPI_LOCALRANKID", "PMI_RANK", "PMI_SIZE"),                                        # MPICH hydra
    ("PMI_LOCAL_RANK", "PMI_RANK", "PMI_SIZE"),                                         # PMI-2/PMIx
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),      # MVAPICH2
    ("PALS_LOCAL_RANKID", "PALS_RANKID", None),                                         # Cray PALS
)


def _env_int(name: str | None) -> int | None:
    v = os.environ.get(name) if name else None
    return int(v) if v is not None and v.strip().isdigit() else None


def _srun_step_matches(r: int, n: int) -> bool:
    """True when this process is task ``r`` of an ``srun`` step of ``n`` tasks (so SLURM_LOCALID is ours).

    Under ``mpiexec`` inside ``salloc``/``sbatch`` every rank inherits the batch step's SLURM_LOCALID=0 and
    SLURM_PROCID=0: the rank or size then disagrees with MPI's, and the Slurm variables are not used.
    """
    return (_env_int("SLURM_LOCALID") is not None and _env_int("SLURM_PROCID") == r
            and _env_int("SLURM_STEP_NUM_TASKS") == n)


def _local_rank_from_launcher(r: int, n: int) -> tuple[int | None, str]:
    """``(local rank, source)`` from the launcher that really started this process, or ``(None, "")``."""
    if _srun_step_matches(r, n):
        return _env_int("SLURM_LOCALID"), "SLURM_LOCALID"
    for local, rank_var, size_var in _LOCAL_RANK_VARS:
        lr = _env_int(local)
        if lr is None or lr >= n:
            continue
        if _env_int(rank_var) != r or (size_var and _env_int(size_var) != n):
            continue
        return lr, local
    return None, ""


def on_mpi_rank() -> bool:
    """True in a process whose MPI is initialised: an engine, a process under ``mpiexec`` or ``srun``.

    Asked without initialising MPI, so asking does not make a notebook's own kernel (which has not imported
    mpi4py's ``MPI``) a rank."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def local_rank(collective: bool = True) -> int:
    """Rank among the processes on this host.

    From the launcher that actually started the process: Slurm's SLURM_LOCALID only in an ``srun`` step
    whose task id and task count match the MPI rank and size, else the MPI launcher's own variable (Open
    MPI, MPICH/Hydra, PMI, MVAPICH2, Cray PALS) when its rank and size match, else an MPI shared-memory
    split of COMM_WORLD (computed once; collective the first time, which :func:`init` is).

    ``collective=False``: for code that one rank runs alone (a task of a load-balanced view), where a
    collective call would wait for ranks that never make it. The split is then used only if it was computed
    before (``MPICluster`` describes every engine when it starts, which computes it); raises
    :class:`LaunchError` when it was not and the world has more than one process.
    """
    comm = _comm()
    value, _ = _local_rank_from_launcher(comm.Get_rank(), comm.Get_size())
    if value is not None:
        return value
    if "local_rank" not in _STATE:
        if not collective and comm.Get_size() > 1:
            raise LaunchError(
                f"the local rank of rank {comm.Get_rank()} is not known without a collective call: its launcher "
                "names none (see _LOCAL_RANK_VARS), and MPI's per-node split needs every rank. Call "
                "ddlcourse.dist.init() (or cluster.placement.local_rank()) on every rank first.")
        from mpi4py import MPI
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        _STATE["local_rank"] = node.Get_rank()
        node.Free()
    return _STATE["local_rank"]


def check_launch() -> None:
    """Refuse an MPI world of one process when the launcher started several (a wrong PMI plugin).

    With the wrong ``srun --mpi=`` plugin, srun starts N processes that each see an MPI world of size 1:
    every one is "rank 0 of 1", every check agrees with itself, and a training job trains N copies.
    """
    n = _comm().Get_size()
    if n != 1:
        return
    said = {v: _env_int(v) for v in ("SLURM_STEP_NUM_TASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    if _env_int("SLURM_PROCID") is None:      # SLURM_STEP_NUM_TASKS speaks for this process only in a step
        said.pop("SLURM_STEP_NUM_TASKS")
    many = {k: v for k, v in said.items() if v is not None and v > 1}
    if many:
        k, v = next(iter(many.items()))
        raise LaunchError(
            f"MPI sees a world of 1 process, but the launcher started {v} ({k}={v}): each process is running "
            "alone as 'rank 0 of 1'. Under srun the PMI plugin does not match this MPI: use "
            "`srun --mpi=pmi2` for the course venv's MPICH (the templates read $DDLCOURSE_SRUN_MPI; "
            "`srun --mpi=list` shows what the site offers: pmix for Open MPI 5, cray_shasta for Cray MPICH), "
            "or start the ranks with the venv's mpiexec. See env/slurm/README.md.")


def _gpus_requested() -> str | None:
    """Why this job looks like it asked for GPUs (for the error when CUDA is unusable), or None."""
    g = os.environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if g.isdigit() and int(g) > 0:
        return f"SLURM_GPUS_ON_NODE={g}"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if cvd and cvd not in ("-1", "NoDevFiles") and not cvd.startswith("-"):
        return f"CUDA_VISIBLE_DEVICES={cvd}"
    return None


def pick_device(local: int | None = None, set_current: bool = True, collective: bool = True):
    """The GPU matching the local rank when CUDA is available, else the CPU.

    ``local``: the local rank (None: this process's, :func:`local_rank`, asked with ``collective``; only
    needed when this process sees several GPUs). ``set_current``: make that GPU the process's current CUDA
    device (a rank does, once, in :func:`init`); a notebook's own kernel, which only asks which device a rank
    would use, does not.

    Raises :class:`LaunchError` when the job asked for GPUs but CUDA is unusable here (a CPU build of
    torch, a driver too old), rather than training on the CPU without a word; set
    ``DDLCOURSE_ALLOW_CPU=1`` to accept the CPU anyway.
    """
    import torch

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if count == 1:
            # One visible GPU: the launcher bound a GPU to this rank (srun --gpus-per-task=1, a site that binds
            # GPUs per task) or the node has one. Either way it is cuda:0; init() checks that no two ranks of a
            # node got the same one (by UUID), which catches the second case.
            idx = 0
        else:
            local = local_rank(collective) if local is None else local
            if local >= count and os.environ.get("DDLCOURSE_SHARE_GPUS") != "1":
                raise LaunchError(
                    f"local rank {local} on {socket.gethostname()} has no GPU of its own: this node shows {count} "
                    f"GPU(s) and at least {local + 1} ranks. Start at most {count} ranks per node (e.g. "
                    f"--ntasks-per-node={count}), or set DDLCOURSE_SHARE_GPUS=1 to let ranks share GPUs on purpose.")
            idx = local % count
        if set_current:
            torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    why = _gpus_requested()
    if why and os.environ.get("DDLCOURSE_ALLOW_CPU") != "1":
        build = (f"this torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None else
                 f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the GPU: "
                 "check the driver (nvidia-smi) against that CUDA version")
        raise LaunchError(
            f"the job asked for GPUs ({why}) but CUDA is not usable here: {build}. Use the GPU environment "
            "(environment.yml, env/GPU_CLUSTER.md), or set DDLCOURSE_ALLOW_CPU=1 to run on the CPU on purpose.")
    return torch.device("cpu")


def gpu_uuid(device) -> str | None:
    """The UUID of this rank's GPU (None on the CPU): the same GPU has one UUID whatever index a rank sees."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def shared_gpu(seen: list[tuple[str, str | None]], me: int) -> str | None:
    """Why rank ``me`` shares its GPU with another rank of its node, or None.

    ``seen[r]`` is rank r's ``(host, GPU UUID)``. Ranks that share a GPU run at a fraction of its speed and
    memory; ``DDLCOURSE_SHARE_GPUS=1`` allows it on purpose."""
    host, uuid = seen[me]
    if uuid is None or os.environ.get("DDLCOURSE_SHARE_GPUS") == "1":
        return None
    same = [r for r, (h, u) in enumerate(seen) if h == host and u == uuid]
    if len(same) < 2:
        return None
    return (f"ranks {same} on {host} all use GPU {uuid}: the launcher gave them the same GPU. Bind one GPU per "
            "task (srun --gpus-per-task=1) or show each rank all of the node's GPUs (srun --gpu-bind=none), "
            "start at most one rank per GPU, or set DDLCOURSE_SHARE_GPUS=1 to share GPUs on purpose.")


def describe() -> dict:
    """Rank, host, pid and device of this process (used by ``MPICluster.report``)."""
    import torch

    dev = pick_device()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    comm = _comm()
    return dict(rank=comm.Get_rank(), size=comm.Get_size(), host=socket.gethostname(), pid=os.getpid(),
                local_rank=local_rank(), device=str(dev) if dev.type == "cpu" else f"{dev} ({name})")


