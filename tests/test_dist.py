"""ddlcourse.dist and checks, on real MPI ranks (mpiexec from the venv)."""
import subprocess
import sys

import pytest

from ddlcourse import checks, dist

from helpers import ROOT, module_command, run_ranks

pytestmark = pytest.mark.mpi


def test_seed_rule_is_documented_and_distinct():
    assert dist.seed_for_rank(1234, 0) == 1234
    assert dist.seed_for_rank(1234, 3) == 4234
    assert len({dist.seed_for_rank(7, r) for r in range(64)}) == 64


def test_expected_sum():
    assert checks.expected_sum(4, 2) == [10.0, 10.0]
    res = [{"mpi4py": [3.0], "torch.distributed": [3.0], "horovod": [3.0]}] * 2
    assert checks.agree(res, 2, 1)
    res[1] = {"mpi4py": [3.0], "torch.distributed": [3.0], "horovod": [2.0]}
    assert not checks.agree(res, 2, 1)


def test_allreduce_three_ways_on_two_ranks(mpi):
    p = mpi(2, "import sys; from ddlcourse.__main__ import main; sys.exit(main(['check', '--length', '3']))")
    assert "all three agree with the expected sum [3.0, 3.0, 3.0]: True" in p.stdout


def test_init_is_idempotent_and_ranks_are_consistent():
    p = run_ranks(3, "dist_init_idempotent")
    assert p.stdout.split() == ["ok0", "ok1", "ok2"]


def test_bad_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        dist.init(backend="mpi", horovod=False)


def test_cli_info_and_errors():
    out = subprocess.run([sys.executable, "-m", "ddlcourse", "info"], capture_output=True, text=True)
    assert out.returncode == 0 and "torch" in out.stdout and "MISSING" not in out.stdout
    bad = subprocess.run([sys.executable, "-m", "ddlcourse", "run", "nosuchcase"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown case 'nosuchcase'" in bad.stderr


def test_subgroup_runs_smaller_worlds_inside_one_cluster():
    assert run_ranks(3, "dist_subgroup").stdout.strip() == "[[1, 2, 3], [2, 3], [3]]"


def test_horovod_can_be_added_after_a_torch_only_init():
    assert run_ranks(2, "dist_horovod_after_torch").stdout.strip() == "2.0"


# ----------------------------------------------------------------------------- launches that must be right
def test_local_rank_ignores_an_inherited_slurm_localid():
    """mpiexec inside sbatch: every rank inherits the batch step's SLURM_LOCALID=0 and SLURM_PROCID=0."""
    env = {"SLURM_LOCALID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_ID": "1"}
    assert run_ranks(2, "dist_local_rank", env=env).stdout.strip() == "[0, 1]"


def test_local_rank_trusts_slurm_in_a_matching_srun_step():
    """In an srun step whose task ids and count match MPI's, SLURM_LOCALID is the launcher's answer."""
    from ddlcourse.cluster import find_mpiexec
    cmd = [find_mpiexec(), "-bind-to", "none"]
    for r in range(2):   # MPMD: each rank its own Slurm variables, local ids deliberately reversed
        if r:
            cmd.append(":")
        cmd += ["-n", "1", "-env", "SLURM_PROCID", str(r), "-env", "SLURM_LOCALID", str(1 - r),
                "-env", "SLURM_STEP_NUM_TASKS", "2", *module_command("dist_local_rank")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[1, 0]"


def _init_alone(env_extra: dict) -> subprocess.CompletedProcess:
    import os
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_", "CUDA_VISIBLE", "DDLCOURSE_ALLOW"))}
    env.update(env_extra)
    return subprocess.run(module_command("dist_init_alone"), capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


def test_a_singleton_launch_is_refused_with_what_to_do():
    """srun with the wrong --mpi plugin: 4 processes, each an MPI world of 1."""
    p = _init_alone({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "4"})
    assert "LaunchError:" in p.stdout, p.stdout + p.stderr
    assert "world of 1 process" in p.stdout and "SLURM_STEP_NUM_TASKS=4" in p.stdout
    assert "--mpi=pmi2" in p.stdout
    hydra = _init_alone({"PMI_SIZE": "2", "PMI_RANK": "0"})
    assert "PMI_SIZE=2" in hydra.stdout, hydra.stdout + hydra.stderr
    alone = _init_alone({})  # a plain single process is fine
    assert alone.stdout.strip() == "device cpu 1", alone.stdout + alone.stderr


def test_gpus_requested_but_cuda_unusable_is_an_error_not_a_silent_cpu_run():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    for var, val in (("CUDA_VISIBLE_DEVICES", "0"), ("SLURM_GPUS_ON_NODE", "4")):
        p = _init_alone({var: val})
        assert "LaunchError:" in p.stdout and f"{var}={val}" in p.stdout, p.stdout + p.stderr
        assert "CPU-only build" in p.stdout and "DDLCOURSE_ALLOW_CPU=1" in p.stdout
    ok = _init_alone({"CUDA_VISIBLE_DEVICES": "0", "DDLCOURSE_ALLOW_CPU": "1"})
    assert ok.stdout.strip() == "device cpu 1", ok.stdout + ok.stderr
    hidden = _init_alone({"CUDA_VISIBLE_DEVICES": ""})   # GPUs hidden on purpose: the CPU, no error
    assert hidden.stdout.strip() == "device cpu 1"


def test_rendezvous_address_is_never_loopback_across_hosts(monkeypatch):
    monkeypatch.delenv("DDLCOURSE_MASTER_ADDR", raising=False)
    one = [("eth0", "10.1.0.5", "255.255.0.0")]
    assert dist.rendezvous_address(["a", "a"], [one, one]) == "127.0.0.1"
    node0 = [("docker0", "172.17.0.1", "255.255.0.0"), ("ib0", "192.0.2.1", "255.255.255.0")]
    node1 = [("docker0", "172.17.0.1", "255.255.0.0"), ("ib0", "192.0.2.2", "255.255.255.0")]
    # docker0 has the same address on every host, so it cannot name rank 0's host: the node network wins
    assert dist.rendezvous_address(["n0", "n1"], [node0, node1]) == "192.0.2.1"
    monkeypatch.setenv("DDLCOURSE_MASTER_ADDR", "198.51.100.7")
    assert dist.rendezvous_address(["n0", "n1"], [node0, node1]) == "198.51.100.7"
    monkeypatch.delenv("DDLCOURSE_MASTER_ADDR")
    with pytest.raises(dist.LaunchError, match="no network address other than loopback"):
        dist.rendezvous_address(["n0", "n1"], [[], node1])


def test_the_store_port_is_the_one_rank0_listens_on():
    """Rank 0 binds port 0 and broadcasts the port the OS gave it (no probe-close-reuse race)."""
    assert run_ranks(2, "dist_store_port").stdout.split() == ["1", "127.0.0.1", "True"]


def _fake_cuda(monkeypatch, count: int):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda idx: None)
    monkeypatch.delenv("DDLCOURSE_SHARE_GPUS", raising=False)


def test_one_gpu_bound_per_task_is_accepted(monkeypatch):
    """srun --gpus-per-task=1 (or a site that binds GPUs per task): every rank sees one GPU, its own."""
    _fake_cuda(monkeypatch, 1)
    for local in range(4):
        assert str(dist.pick_device(local)) == "cuda:0"
    seen = [("n0", f"GPU-{r}") for r in range(4)] + [("n1", f"GPU-{r}") for r in range(4)]  # per node, distinct
    assert all(dist.shared_gpu(seen, r) is None for r in range(8))


def test_ranks_that_share_one_gpu_are_refused(monkeypatch):
    _fake_cuda(monkeypatch, 4)
    assert str(dist.pick_device(2)) == "cuda:2"
    with pytest.raises(dist.LaunchError, match="no GPU of its own"):
        dist.pick_device(4)
    seen = [("n0", "GPU-a"), ("n0", "GPU-a"), ("n1", "GPU-a")]    # one GPU given to both ranks of n0
    why = dist.shared_gpu(seen, 1)
    assert "ranks [0, 1] on n0 all use GPU GPU-a" in why and "--gpus-per-task=1" in why
    assert dist.shared_gpu(seen, 2) is None and dist.shared_gpu([("n0", None)] * 2, 0) is None   # CPU ranks
    monkeypatch.setenv("DDLCOURSE_SHARE_GPUS", "1")
    assert dist.shared_gpu(seen, 1) is None


def test_outside_a_run_the_device_is_named_not_set(monkeypatch):
    """A notebook's kernel asks which device a rank would use (device.rank_device) without changing its own
    current CUDA device; a rank's init sets it (issue 28)."""
    import torch
    from ddlcourse import device
    from ddlcourse.cluster import placement
    _fake_cuda(monkeypatch, 2)
    # the kernel: neither torch.distributed nor MPI started (a test process may have started either before)
    monkeypatch.setattr(device.tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(placement, "on_mpi_rank", lambda: False)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert str(device.rank_device()) == "cuda:0" and calls == []
    assert str(dist.pick_device(1)) == "cuda:1" and calls == [1]


def test_on_first_ranks_gives_a_comm_or_a_group_and_a_comm_first_does_not_hide_the_group():
    """One ``dist.on_first_ranks`` (issue 28): ``fn(comm=)`` for MPI code, ``fn(group=)`` otherwise. A subgroup
    made before torch.distributed started (the MPI path) gets its torch group once it has (it used to stay None,
    so a later group function silently ran nowhere)."""
    assert run_ranks(3, "dist_on_first_ranks").stdout.strip().splitlines()[-1] == "[(3, 3.0), (3, 3.0), (None, None)]"
