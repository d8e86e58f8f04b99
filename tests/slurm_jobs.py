"""Batch jobs on the test Slurm clusters (tests/test_slurm.py: one node; tests/test_multinode.py: two).

Launches of pip's MPICH under ``srun --mpi=pmi2`` break at start-up now and then: slurmstepd logs garbled
requests ("mpi/pmi2: value not properly terminated in client request", "invalid client request"), then MPI_Init
aborts or the ranks wait on the PMI fence. Two earlier guesses (a stale shared-memory segment of an earlier job;
two "nodes" sharing /dev/shm) were fixed and the failure stayed. The cause is Slurm's, described at
``ddlcourse.cluster.launch.PMI_CUT_SIGNS`` (tests/test_slurm.py::test_long_pmi1_requests_are_cut shows the limit). The
wheel's MPICH cannot speak PMI-2 (it aborts in MPIR_pmi_init), and its OFI network module, whose address is
short, deadlocks the course's rendezvous (a bcast left unprogressed on the sending rank). So a launch that shows
those signs is retried, up to ATTEMPTS in all, each retry printed, and a job that hangs after them is cancelled
after a grace period instead of at its time limit; MPICluster.start does the same for its engines.
env/slurm/README.md tells attendees the same.
"""
from __future__ import annotations

import getpass
import subprocess
import time
from pathlib import Path
from typing import Callable

from ddlcourse.cluster.launch import PMI_START_ATTEMPTS as ATTEMPTS, pmi_cut as pmi_flake  # noqa: F401  (see above)

Slurm = Callable[[list[str]], subprocess.CompletedProcess]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def retry_launch(slurm: Slurm, what: str, run: Callable[[], subprocess.CompletedProcess]):
    """``run()`` (an srun or salloc launch), again (up to ATTEMPTS in all) while its start-up broke in PMI; each
    retry is printed.

    A launch that hangs after the PMI signs reaches its timeout; its jobs are then cancelled (``scancel`` of
    this user's jobs on the test cluster) before the retry."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            p = run()
        except subprocess.TimeoutExpired as e:
            out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
            if not pmi_flake(out) or attempt == ATTEMPTS:
                raise
            slurm(["scancel", "--user", getpass.getuser()])
            p = subprocess.CompletedProcess(e.cmd, -9, out, "")
        out = p.stdout + p.stderr
        if p.returncode == 0 or not pmi_flake(out) or attempt == ATTEMPTS:
            return p
        print(f"[slurm] {what}: MPI start-up broke under srun (PMI), attempt {attempt} of {ATTEMPTS}; retrying. "
              f"Its output:\n{out[-1500:]}")
    raise AssertionError("unreachable")


def wait_for_job(slurm: Slurm, job: str, output: Path, timeout: float = 600, pending_timeout: float = 120,
                 flake_grace: float = 30) -> str:
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
    """``sbatch --parsable -o <output> <sbatch_args>``, waited for; again (up to ATTEMPTS) while its launch broke
    in PMI.

    ``output`` names the job's output file with ``%j`` for the job id. Returns (job id, ``scontrol show job``,
    the job's output).
    """
    for attempt in range(1, ATTEMPTS + 1):
        p = slurm(["sbatch", "--parsable", "-o", str(output), *sbatch_args])
        assert p.returncode == 0, p.stderr
        job = p.stdout.strip().split(";")[0]
        out_path = Path(str(output).replace("%j", job))
        info = wait_for_job(slurm, job, out_path, **wait)
        out = _read(out_path)
        if "JobState=COMPLETED" in info or not pmi_flake(out) or attempt == ATTEMPTS:
            return job, info, out
        print(f"[slurm] {what}: job {job} broke in MPI start-up under srun --mpi=pmi2 (attempt {attempt} of "
              f"{ATTEMPTS}); retrying. Its output:\n{out[-1500:]}")
    raise AssertionError("unreachable")
