"""The cluster runtime: start and stop an ipyparallel cluster of MPI engines, and know where each rank runs.

This layer teaches nothing; it gives the notebooks their ranks. A notebook needs two names::

    from ddlcourse import cluster
    c = cluster.start(n=2)          # or: with cluster.MPICluster(n=2) as c: ...
    c.run(fn, *args)                # fn on every rank, results in rank order
    c.stop()

Modules
-------
mpicluster  MPICluster: the controller, the engines, run() on the ranks, a clean stop (the notebooks' entry point)
launch      how ranks are launched (mpiexec or srun), what a Slurm allocation allows, MPI jobs of the kernel's own
placement   where this process runs: its local rank, its device, and launches that cannot train correctly
canning     the learner's own torch modules and autograd Functions, sent to the engines by value
engine      the engine program: ipyparallel's engine, importing torch while it registers
forkserver  a server that has imported torch once and forks ranks and engines from it
processes   the record of what each cluster started, and the clean-up from it (stop_all)
watchdog    the process that stops a cluster when the kernel that started it dies

The names below are this package's public face, loaded on first use: ``placement`` and ``watchdog`` run on
every rank and in a bare watchdog process, which must not pay for importing ipyparallel.
"""
from __future__ import annotations

import importlib

# name -> the module of this package that defines it
_PUBLIC = {
    "MPICluster": "mpicluster", "RankInfo": "mpicluster", "RanksTimeout": "mpicluster", "start": "mpicluster",
    "ClusterError": "launch", "find_mpiexec": "launch", "default_n": "launch", "available_cores": "launch",
    "launch_command": "launch", "in_slurm_allocation": "launch", "may_span_hosts": "launch",
    "allocation_tasks": "launch", "allocation_nodes": "launch", "allocation_has_gpus": "launch",
    "stop_all": "processes", "recorded_clusters": "processes", "find_processes": "processes",
    "runtime_dir": "processes",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
