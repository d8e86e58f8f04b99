"""The test clusters' job helper (tests/slurm_jobs.py) against a fake Slurm: a launch that broke in PMI is
cancelled when it hangs and retried, up to ATTEMPTS launches in all; any other failure is not retried."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_jobs import ATTEMPTS, pmi_flake, retry_launch, run_batch_job, wait_for_job

BROKEN = ("slurmstepd-ddlnode2: error: mpi/pmi2: value not properly terminated in client request\n"
          "slurmstepd-ddlnode2: error: mpi/pmi2: invalid client request\n")


class FakeSlurm:
    """Jobs numbered from 1; ``plan[i]`` says what job i+1 does: (output, final state, hangs)."""

    def __init__(self, tmp: Path, plan: list[tuple[str, str, bool]]):
        self.tmp, self.plan, self.calls, self.jobs = tmp, plan, [], {}

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        ok = lambda out="": subprocess.CompletedProcess(argv, 0, out, "")  # noqa: E731
        if argv[0] == "sbatch":
            job = str(len(self.jobs) + 1)
            text, final, hangs = self.plan[len(self.jobs)]
            Path(argv[argv.index("-o") + 1].replace("%j", job)).write_text(text)
            self.jobs[job] = {"final": final, "running": hangs}
            return ok(f"{job};cluster\n")
        if argv[:2] == ["scancel", "--user"]:  # every job of the user
            for j in self.jobs.values():
                j.update(running=False, final="CANCELLED")
            return ok()
        job = argv[-1] if argv[0] == "scancel" else argv[argv.index("-j") + 1] if "-j" in argv else argv[-1]
        if argv[0] == "squeue":
            return ok("RUNNING\n" if self.jobs[job]["running"] else "")
        if argv[0] == "scancel":
            self.jobs[job].update(running=False, final="CANCELLED")
            return ok()
        return ok(f"JobId={job} JobState={self.jobs[job]['final']} Reason=None\n")  # scontrol show job


def test_pmi_flake_signs():
    assert pmi_flake(BROKEN)
    assert pmi_flake("Abort(1): Fatal error in internal_Init_thread: MPI_Init_thread(...) failed")
    assert not pmi_flake("Traceback (most recent call last):\nValueError: bad batch size")
    assert not pmi_flake("")


def test_a_hung_broken_launch_is_cancelled_and_retried(tmp_path, capsys):
    fake = FakeSlurm(tmp_path, [(BROKEN, "RUNNING", True), ("loss 0.5\n", "COMPLETED", False)])
    job, info, out = run_batch_job(fake, ["lab.sbatch"], tmp_path / "job-%j.out", "lab", flake_grace=0.2)
    assert job == "2" and "JobState=COMPLETED" in info and out == "loss 0.5\n"
    assert ["scancel", "1"] in fake.calls and sum(c[0] == "sbatch" for c in fake.calls) == 2
    printed = capsys.readouterr().out
    assert "job 1 still RUNNING" in printed and f"attempt 1 of {ATTEMPTS}); retrying" in printed


def test_a_course_failure_is_not_retried(tmp_path):
    fake = FakeSlurm(tmp_path, [("ValueError: bad batch size\n", "FAILED", False)])
    job, info, out = run_batch_job(fake, ["lab.sbatch"], tmp_path / "job-%j.out", "lab", flake_grace=0.2)
    assert job == "1" and "JobState=FAILED" in info and sum(c[0] == "sbatch" for c in fake.calls) == 1


def test_the_last_broken_launch_is_reported_not_retried_again(tmp_path):
    fake = FakeSlurm(tmp_path, [(BROKEN, "FAILED", False)] * ATTEMPTS + [("", "COMPLETED", False)])
    job, info, _ = run_batch_job(fake, ["lab.sbatch"], tmp_path / "job-%j.out", "lab", flake_grace=0.2)
    assert job == str(ATTEMPTS) and "JobState=FAILED" in info


def test_a_job_hanging_without_pmi_signs_fails_with_its_output(tmp_path):
    fake = FakeSlurm(tmp_path, [("epoch 1\n", "RUNNING", True)])
    fake(["sbatch", "-o", str(tmp_path / "job-%j.out")])
    with pytest.raises(AssertionError, match=r"(?s)job 1 still RUNNING.*epoch 1"):
        wait_for_job(fake, "1", tmp_path / "job-1.out", timeout=0.3, flake_grace=0.1)
    assert ["scancel", "1"] in fake.calls


def test_a_launch_that_hangs_after_broken_pmi_is_cancelled_and_retried(tmp_path, capsys):
    fake = FakeSlurm(tmp_path, [])
    calls = []

    def launch():
        calls.append(1)
        if len(calls) == 1:
            raise subprocess.TimeoutExpired(["srun"], 300, output=BROKEN.encode(), stderr=None)
        return subprocess.CompletedProcess(["srun"], 0, "ok\n", "")

    p = retry_launch(fake, "srun check", launch)
    assert p.returncode == 0 and len(calls) == 2 and fake.calls[0][:2] == ["scancel", "--user"]
    assert f"attempt 1 of {ATTEMPTS}; retrying" in capsys.readouterr().out


def test_a_launch_that_hangs_for_another_reason_is_not_retried(tmp_path):
    fake = FakeSlurm(tmp_path, [])

    def launch():
        raise subprocess.TimeoutExpired(["srun"], 300, output=b"epoch 1\n", stderr=None)

    with pytest.raises(subprocess.TimeoutExpired):
        retry_launch(fake, "srun check", launch)
    assert not fake.calls
