"""Notebook 07 · DDP with gloo's default hook against the MPI hooks of :mod:`ddlcourse.parallel.mpi_hook`, each against serial."""
import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddlcourse import bench, dist
from ddlcourse.data.toy import teacher_classification
from ddlcourse.models.small import MLP
from ddlcourse.parallel.mpi_hook import HOOKS, comm_for, hook_state, register_mpi_hook


def compare_hooks(steps: int = 4, global_batch: int = 32, hidden: int = 64, time_steps: int = 10,
                  group=None) -> dict:
    """Train one MLP with DDP four ways on the ranks of ``group`` and compare with serial: DDP's default hook
    (gloo), this module's two MPI hooks (blocking and overlapping), and torch's ``fp16_compress_hook``
    (gradients sent in half precision).

    The comparison is of CPU transports, so model and data stay on the CPU on every node, a GPU node too: there
    the default group is ``cpu:gloo,cuda:nccl``, and CPU buckets go through gloo or MPI as here (CUDA tensors
    would send every bucket through NCCL, whatever the hook).

    Returns ``{hook: {"max_diff": |params - serial|, "seconds": median s/step (slowest rank), "buckets": ...}}``,
    where ``buckets`` (MPI hooks only) counts the buckets that went through MPI (``"mpi"``) and those left to the
    default hook (``"default"``). Runs on every rank of ``group``.
    """
    from mpi4py import MPI

    dist.init()
    world, r = tdist.get_world_size(group), tdist.get_rank(group)
    X, y = teacher_classification(4 * global_batch, dim=16, n_classes=4, seed=2)    # on the CPU, as the model
    comm = comm_for(group)
    comm = comm if comm is not None else MPI.COMM_WORLD

    def train(hook: str | None):
        torch.manual_seed(0)
        model = MLP(16, 4, hidden=hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        state = None
        if hook is not None:
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
            if hook in ("mpi", "mpi-overlap"):
                register_mpi_hook(model, group, hook_mode=hook)
                state = hook_state(model)
            elif hook == "fp16":
                model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        n, me = (1, 0) if hook is None else (world, r)

        def step(s):
            idx = (torch.arange(global_batch) + s * global_batch) % X.shape[0]
            mine = idx[me::n]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(X[mine]), y[mine]).backward()
            opt.step()

        for s in range(steps):
            step(s)
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        secs = None
        if hook is not None:
            st = bench.time_steps(lambda: step(0), n_steps=time_steps, warmup=1, sync=comm.Barrier)
            secs = comm.allreduce(st.median, op=MPI.MAX)
        return params, secs, state

    serial, _, _ = train(None)
    out = {}
    for hook in HOOKS:
        p, secs, state = train(hook)
        out[hook] = {"max_diff": comm.allreduce((p - serial).abs().max().item(), op=MPI.MAX), "seconds": secs,
                     "buckets": None if state is None else {"mpi": state.mpi_buckets, "default": state.buckets["default"]}}
    return out
