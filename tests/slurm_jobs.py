"""Batch jobs on the test Slurm clusters (tests/test_slurm.py: one node; tests/test_multinode.py: two).

Launches of pip's MPICH under ``srun --mpi=pmi2`` used to break at start-up now and then: slurmstepd logged
garbled PMI-2 requests ("mpi/pmi2: value not properly terminated in client request"), then MPI_Init aborted
("failed to unpack address") or the ranks waited forever on the PMI fence. The cause: every fresh test
cluster numbered its jobs from 1, MPICH names its shared-memory segment after the PMI kvsname
("<job>.<step>"), and a killed job of an earlier cluster had left that segment in /dev/shm; the new job
attached to the stale data. env/slurm/local_slurm.sh now starts each cluster at a random FirstJobId. On the
two-node cluster the same signs came from the two "nodes" sharing the machine's /dev/shm (a job step's ranks on
both nodes attached to one segment); env/multinode/two_nodes.sh now gives each node command its own /dev/shm.
The check below stays as a guard: a launch that still shows those signs is retried once and the retry is
printed, and a job that hangs after them is cancelled after a grace period instead of at its time limit.
"""
from __future__ import annotations

import getpass
import subprocess
import time
from pathlib import Path
from typing import Callable

Slurm = Callable[[list[str]], subprocess.CompletedProcess]

PMI_SIGNS = ("mpi/pmi2: invalid client request", "mpi/pmi2: value not properly terminated")


def pmi_flake(text: str) -> bool:
    """The output of a launch shows MPICH's start-up under srun --mpi=pmi2 breaking."""
    return ("MPI_Init_thread" in text and "failed" in text) or any(sign in text for sign in PMI_SIGNS)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def retry_launch(slurm: Slurm, what: str, run: Callable[[], subprocess.CompletedProcess]):
    """``run()`` (an srun or salloc launch), once more when its start-up broke in PMI; the retry is printed.

    A launch that hangs after the PMI signs reaches its timeout; its jobs are then cancelled (``scancel`` of
    this user's jobs on the test cluster) before the retry."""
    try:
        p = run()
    except subprocess.TimeoutExpired as e:
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        if not pmi_flake(out):
            raise
        slurm(["scancel", "--user", getpass.getuser()])
        p = subprocess.CompletedProcess(e.cmd, -9, out, "")
    out = p.stdout + p.stderr
    if p.returncode != 0 and pmi_flake(out):
        print(f"[slurm] {what}: MPI start-up failed under srun (PMI); retrying once. First attempt:\n{out[-1500:]}")
        p = run()
    return p


def wait_for_job(slurm: Slurm, job: str, output: Path, timeout: float = 600, pending_timeout: float = 120,
                 flake_grace: float = 60) -> str:
    """Wait until ``job`` leaves the queue and return ``scontrol show job``.

    A job whose output shows the PMI signs and still runs ``flake_grace`` s later is cancelled (its
    JobState is then not COMPLETED, so the caller's retry applies). Any other job still queued after
    ``timeout`` s (``pending_timeout`` s while PENDING) is cancelled and fails with its steps and output.
    """
    t0, flake_at, cancelled = time.time(), None, False
    deadline = t0 + timeout
    while True:
        state = slurm(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
        if not state:
            return slurm(["scontrol", "show", "job", job]).stdout
        now = time.time()
        if flake_at is None and pmi_flake(_read(output)):
            flake_at = now
        if not cancelled and flake_at is not None and now - flake_at > flake_grace:
            print(f"[slurm] job {job} still {state} {flake_grace:.0f} s after a broken PMI start-up: cancelled")
            slurm(["scancel", job])
            cancelled, deadline = True, now + 120  # give the cancellation 2 minutes
        elif now > deadline or (state.startswith("PENDING") and now - t0 > pending_timeout):
            steps = slurm(["squeue", "-s", "-j", job]).stdout
            slurm(["scancel", job])
            raise AssertionError(f"job {job} still {state} after {now - t0:.0f} s; steps:\n{steps}\n"
                                 f"output:\n{_read(output)[-5000:]}")
        time.sleep(0.5)


def run_batch_job(slurm: Slurm, sbatch_args: list[str], output: Path, what: str,
                  **wait) -> tuple[str, str, str]:
    """``sbatch --parsable -o <output> <sbatch_args>``, waited for; once more if its launch broke in PMI.

    ``output`` names the job's output file with ``%j`` for the job id. Returns (job id, ``scontrol show job``,
    the job's output).
    """
    for attempt in (1, 2):
        p = slurm(["sbatch", "--parsable", "-o", str(output), *sbatch_args])
        assert p.returncode == 0, p.stderr
        job = p.stdout.strip().split(";")[0]
        out_path = Path(str(output).replace("%j", job))
        info = wait_for_job(slurm, job, out_path, **wait)
        out = _read(out_path)
        if "JobState=COMPLETED" in info or not pmi_flake(out) or attempt == 2:
            return job, info, out
        print(f"[slurm] {what}: job {job} broke in MPI start-up under srun --mpi=pmi2; retrying once. "
              f"First job's output:\n{out[-1500:]}")
    raise AssertionError("unreachable")
