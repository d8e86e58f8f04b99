"""MPICluster across the nodes of a Slurm allocation, step by step (driven by tests/test_multinode.py).

    salloc -N2 --ntasks-per-node=2 python env/multinode/engines_probe.py srun|mpiexec

0. (srun) ask for one engine more than the allocation has tasks: a ClusterError that says what to do;
1. start ``MPICluster(n=$SLURM_NTASKS, launcher=...)``, ``report()``, and ``run`` the allreduce check;
2. ``stop()``; print ``STOPPED`` and wait for a line on stdin (the test looks at every node meanwhile: the
   allocation is still alive, so Slurm has not cleaned anything up for us);
3. start again, kill the engine of the last rank *on its own node* (``srun --overlap -w <node> kill -9``),
   time how long ``run`` takes to raise, ``stop()``, print ``STOPPED`` and wait again.

Each step prints one line ``PROBE <step> {json}``.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import time


def say(step: str, **data) -> None:
    print(f"PROBE {step} {json.dumps(data)}", flush=True)


def pause(step: str, c) -> None:
    say(step, ranks=[[r.host, r.pid] for r in c.ranks], stop_seconds=round(c.stop_seconds, 2))
    sys.stdin.readline()   # the test has looked at both nodes


def start(c) -> None:
    """``c.start()``, retried once when it broke before any engine registered: an engine's MPI_Init failed (a
    stale MPICH segment of an earlier cluster, see tests/slurm_jobs.py: now avoided), or srun exited with no
    word on why (seen once in CI, 2026-11-28, "srun exited after 0 of 4 engines registered"; the error now says
    how the launcher ended). The retry is printed, with the first error, and the test prints it."""
    try:
        c.start()
    except Exception as e:
        if "MPI_Init" not in str(e) and f"after 0 of {c.n} engines registered" not in str(e):
            raise
        say("retry", error=str(e)[-1500:])
        c.start()


def main(launcher: str) -> int:
    from ddlcourse import checks, cluster

    faulthandler.register(signal.SIGUSR1)  # a test that times out asks for the stacks before it kills us

    n = cluster.default_n()
    if launcher == "srun":  # more engines than tasks: a clear error before anything starts (mpiexec warns)
        too_many = None
        try:
            cluster.MPICluster(n=n + 1, launcher=launcher, quiet=True).start().stop()
        except cluster.ClusterError as e:
            too_many = str(e)
        say("too-many", n=n + 1, error=too_many)
    c = cluster.MPICluster(n=n, launcher=launcher)
    start(c)
    ranks = c.report()
    results = c.run(checks.allreduce_three_ways, 4)
    say("started", launcher=launcher, n=n, hosts=[r.host for r in ranks], local_ranks=[r.local_rank for r in ranks],
        pids=[r.pid for r in ranks], agree=checks.agree(results, n, 4), start_seconds=round(c.start_seconds, 2))
    c.stop()
    pause("stopped", c)

    start(c)
    victim = c.ranks[-1]
    kill = subprocess.run(["srun", "--overlap", "-N1", "-n1", f"--nodelist={victim.host}", "--mpi=none",
                           "kill", "-9", str(victim.pid)], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_NAME",)})
    t0 = time.perf_counter()
    error = None
    try:
        c.run(checks.allreduce_three_ways, 4)
    except cluster.ClusterError as e:
        error = str(e)
    say("killed", victim=[victim.rank, victim.host, victim.pid], kill_rc=kill.returncode,
        kill_err=kill.stderr[-500:], error=error, seconds=round(time.perf_counter() - t0, 2),
        error_type=None if error is None else "ClusterError")
    c.stop()
    pause("stopped-after-kill", c)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "auto"))
