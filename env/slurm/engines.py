"""Start the course's ipyparallel MPI engines over a Slurm allocation and show where each rank runs.

Run it inside an allocation (``salloc``, ``sbatch engines.sbatch``, or a JupyterLab started by
``jupyter.sbatch``)::

    salloc --nodes=2 --ntasks-per-node=4 --cpus-per-task=8 python env/slurm/engines.py

``ddlcourse.cluster.MPICluster()`` sees ``SLURM_JOB_ID``/``SLURM_NTASKS`` and launches one engine per task
with ``srun`` (``--mpi=$DDLCOURSE_SRUN_MPI``, detected from mpi4py's MPI when unset), the controller
listening on all interfaces so engines on other nodes can reach it. This script is the same three lines
a notebook runs; it also checks that mpi4py, torch.distributed and Horovod all sum correctly across the
engines, with CPU tensors and, on GPU nodes, CUDA tensors (``checks.agree``).
"""
from __future__ import annotations

import os
import sys


def main() -> int:
    from ddlcourse import checks, cluster
    from ddlcourse.cluster.launch import srun_mpi_plugin

    if not cluster.in_slurm_allocation():
        print("not inside a Slurm allocation: run it under salloc or sbatch (see env/slurm/README.md)")
        return 2
    # srun's PMI plugin must match the MPI mpi4py was built with, or every engine is a world of its own
    plugin, why = srun_mpi_plugin()
    os.environ["DDLCOURSE_SRUN_MPI"] = plugin
    print(f"srun --mpi={plugin}: {why}")
    with cluster.MPICluster() as c:           # n = $SLURM_NTASKS, launcher = srun
        c.report()
        results = c.run(checks.allreduce_three_ways, 4)
        ok = checks.agree(results, c.n, 4)
        print(f"engines via {cluster.launch_command(c.n)[0]}: {c.n} rank(s); allreduce three ways agree: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
