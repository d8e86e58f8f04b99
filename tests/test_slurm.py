"""The Slurm templates of env/slurm/, checked two ways.

* Dry run (always, fast): each template renders the command it would run, without Slurm.
* A real single-node Slurm on loopback (slow, part of ``make test``): ``env/slurm/local_slurm.sh`` starts
  munged + slurmctld + slurmd with a generated config under a temp dir; we submit ``lab.sbatch`` on 2 tasks,
  check its summary file, start the course's MPI engines through srun from Python inside ``salloc``, and
  stop everything. It needs root (slurmd starts jobs as their user); if ``slurmctld`` is missing it installs
  Debian's ``slurm-wlm`` and ``munge`` with apt-get (bounded time). Without root or apt it is skipped, with
  the reason, and the dry-run tests remain.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_jobs import retry_launch, run_batch_job  # tests/, on sys.path under pytest

ROOT = Path(__file__).resolve().parent.parent
SLURM_DIR = ROOT / "env" / "slurm"
TEMPLATES = ["lab.sbatch", "engines.sbatch", "jupyter.sbatch", "local_slurm.sh"]


def _clean_env(**extra) -> dict:
    """This environment without any Slurm job variables (the test may itself run inside a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env.update(DDLCOURSE_PYTHON=sys.executable, DDLCOURSE_SCALE="smoke", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _bash(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], capture_output=True, text=True, cwd=ROOT, env=env or _clean_env(),
                          timeout=timeout)


# ----------------------------------------------------------------------------------------- dry run
@pytest.mark.parametrize("name", TEMPLATES)
def test_template_syntax(name):
    p = _bash("-n", str(SLURM_DIR / name))
    assert p.returncode == 0, p.stderr


def test_lab_template_dry_run_cpu():
    env = _clean_env(DDLCOURSE_DRY_RUN="1", SLURM_CPUS_PER_TASK="4")
    env.pop("DDLCOURSE_SRUN_MPI", None)
    p = _bash(str(SLURM_DIR / "lab.sbatch"), "maize", "--scale", "smoke", "--backend", "horovod", env=env)
    assert p.returncode == 0, p.stderr
    cmd = p.stdout.split()
    # no DDLCOURSE_SRUN_MPI: detected from the MPI mpi4py was built with (the venv's MPICH wheel -> pmi2)
    assert cmd[:2] == ["srun", "--mpi=pmi2"] and "--cpus-per-task=4" in cmd
    assert "srun --mpi=pmi2: MPICH" in p.stderr
    assert cmd[cmd.index("-m"):] == ["-m", "ddlcourse", "run", "maize", "--scale", "smoke", "--backend", "horovod"]
    assert "--gpu-bind=none" not in cmd  # no GPU option on CPU nodes


def test_lab_template_dry_run_gpu():
    env = _clean_env(DDLCOURSE_DRY_RUN="1", SLURM_GPUS_ON_NODE="4", DDLCOURSE_SRUN_MPI="pmix")
    p = _bash(str(SLURM_DIR / "lab.sbatch"), "seismic", "--scale", "cluster", env=env)
    assert p.returncode == 0, p.stderr
    cmd = p.stdout.split()
    assert "--mpi=pmix" in cmd and "--gpu-bind=none" in cmd and "--cpus-per-task=1" in cmd


def test_every_template_takes_the_pmi_plugin_from_one_variable():
    """DDLCOURSE_SRUN_MPI overrides; unset, each template asks ddlcourse.checks (never a hard-coded default)."""
    for name in ("lab.sbatch", "engines.sbatch", "jupyter.sbatch"):
        text = (SLURM_DIR / name).read_text()
        assert 'SRUN_MPI=${DDLCOURSE_SRUN_MPI:-$("$PY" -m ddlcourse srun-mpi --explain)}' in text, name
        assert "export DDLCOURSE_SRUN_MPI=$SRUN_MPI" in text, name
        assert "DDLCOURSE_SRUN_MPI:-pmi2" not in text, name


@pytest.mark.parametrize("name", ["lab.sbatch", "jupyter.sbatch"])
def test_templates_put_the_data_cache_on_scratch(name):
    """The labs' data sets take tens of GB at cluster scale, more than a home quota: the templates point
    DDLCOURSE_DATA_DIR at $SCRATCH, keep one the user set, and warn when neither is there."""
    args = ["check"] if name == "lab.sbatch" else []
    base = dict(DDLCOURSE_DRY_RUN="1", DDLCOURSE_JUPYTER_PORT="8999", JUPYTER_TOKEN="abc", USER="alice")
    for given, expect in ((dict(SCRATCH="/scratch/alice"), "data cache: /scratch/alice/ddlcourse/data"),
                          (dict(SCRATCH="/scratch/alice", DDLCOURSE_DATA_DIR="/work/alice/ddl"), "data cache: /work/alice/ddl"),
                          ({}, "WARNING: neither DDLCOURSE_DATA_DIR nor SCRATCH is set")):
        env = _clean_env(**base)
        env.pop("SCRATCH", None)
        env.pop("DDLCOURSE_DATA_DIR", None)
        p = _bash(str(SLURM_DIR / name), *args, env=dict(env, **given))
        assert p.returncode == 0 and f"[{name}] {expect}" in p.stderr, (given, p.stderr)


def test_lab_template_falls_back_to_pmi2_and_says_so():
    env = _clean_env(DDLCOURSE_DRY_RUN="1", DDLCOURSE_PYTHON="false")   # a Python that cannot answer
    env.pop("DDLCOURSE_SRUN_MPI", None)
    p = _bash(str(SLURM_DIR / "lab.sbatch"), "check", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:2] == ["srun", "--mpi=pmi2"]
    assert "could not detect the MPI of mpi4py; assuming srun --mpi=pmi2" in p.stderr


def test_lab_template_needs_a_case():
    p = _bash(str(SLURM_DIR / "lab.sbatch"), env=_clean_env(DDLCOURSE_DRY_RUN="1"))
    assert p.returncode != 0 and "usage" in p.stderr


def test_jupyter_template_dry_run():
    env = _clean_env(DDLCOURSE_DRY_RUN="1", DDLCOURSE_JUPYTER_PORT="8999", JUPYTER_TOKEN="abc",
                     DDLCOURSE_LOGIN_HOST="login1", USER="alice")
    p = _bash(str(SLURM_DIR / "jupyter.sbatch"), env=env)
    assert p.returncode == 0, p.stderr
    assert "ssh -N -L 8888:127.0.0.1:8999 -J alice@login1 alice@" in p.stdout
    assert "http://127.0.0.1:8888/lab?token=abc" in p.stdout
    assert "--ip=127.0.0.1 --port=8999" in p.stdout  # loopback only, never all interfaces by default
    assert "scale smoke, srun --mpi=pmi2" in p.stdout and "WARNING" not in p.stdout  # no allocation: no advice


def _sbatch_options(name: str) -> dict[str, str]:
    opts = {}
    for line in (SLURM_DIR / name).read_text().splitlines():
        if line.startswith("#SBATCH --"):
            k, _, v = line[len("#SBATCH --"):].partition("=")
            opts[k] = v
    return opts


def test_jupyter_template_asks_for_the_engines_the_notebooks_start():
    """One task per GPU, and as many tasks as notebook 00 starts at the template's default scale (cluster);
    sections that start more are named, with their count, in the template's header."""
    from ddlcourse import checks, config
    opts = _sbatch_options("jupyter.sbatch")
    tasks = int(opts["nodes"]) * int(opts["ntasks-per-node"])
    assert opts["gpus-per-node"] == opts["ntasks-per-node"]
    assert 'DDLCOURSE_SCALE=${DDLCOURSE_SCALE:-cluster}' in (SLURM_DIR / "jupyter.sbatch").read_text()
    assert tasks == config.sizes("setup_check", "cluster").n_ranks
    header = (SLURM_DIR / "jupyter.sbatch").read_text().split("#SBATCH")[0]
    for section, n in checks.engines_needed("cluster").items():
        if n > tasks:
            assert f"({n})" in header, f"{section} starts {n} engines at cluster scale; say so in the header"


def test_jupyter_template_warns_when_the_allocation_is_too_small():
    env = _clean_env(DDLCOURSE_DRY_RUN="1", DDLCOURSE_JUPYTER_PORT="8999", JUPYTER_TOKEN="abc", USER="alice",
                     SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="2(x1)", SLURM_GPUS_ON_NODE="1")
    env.pop("DDLCOURSE_SCALE")                           # the template's own default: cluster
    p = _bash(str(SLURM_DIR / "jupyter.sbatch"), env=env)
    assert p.returncode == 0, p.stderr                   # a warning, never a refusal
    assert "WARNING: 2 task(s) in this allocation, but at scale 'cluster'" in p.stdout
    assert "WARNING: 2 tasks per node but 1 GPU(s) per node: ranks will share GPUs" in p.stdout
    assert "scale cluster" in p.stdout


def test_engines_template_dry_run():
    p = _bash(str(SLURM_DIR / "engines.sbatch"), env=_clean_env(DDLCOURSE_DRY_RUN="1"))
    assert p.returncode == 0 and p.stdout.split()[-1] == "env/slurm/engines.py"


def test_generated_config(tmp_path):
    p = _bash(str(SLURM_DIR / "local_slurm.sh"), "config", str(tmp_path / "s"))
    assert p.returncode == 0, p.stderr
    conf = dict(line.split("=", 1) for line in (tmp_path / "s" / "slurm.conf").read_text().splitlines()
                if "=" in line and not line.startswith("#") and not line.startswith(("NodeName", "PartitionName")))
    assert conf["ProctrackType"] == "proctrack/linuxproc" and conf["TaskPlugin"] == "task/none"
    assert conf["SelectType"] == "select/cons_tres" and conf["SlurmctldHost"].endswith("(127.0.0.1)")
    assert conf["StateSaveLocation"].startswith(str(tmp_path))
    assert 1000 <= int(conf["FirstJobId"]) < 60_001_000 <= 67_043_328  # Slurm's default MaxJobId


def test_launch_command_in_allocation(monkeypatch):
    from ddlcourse import cluster
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("DDLCOURSE_SRUN_MPI", "pmi2")
    assert cluster.in_slurm_allocation() and cluster.default_n() == 3
    if shutil.which("srun"):
        launcher, cmd, args = cluster.launch_command(3, threads_per_rank=2)
        assert launcher == "srun" and "--mpi=pmi2" in args and "--cpus-per-task=2" in args
    monkeypatch.delenv("SLURM_JOB_ID")
    assert not cluster.in_slurm_allocation() and cluster.default_n() == 2


# ----------------------------------------------------------------------------------------- real Slurm
def _ensure_slurm() -> str | None:
    """None when slurmctld/slurmd/munged/sbatch are here (installing them if we can), else the reason."""
    needed = ("slurmctld", "slurmd", "munged", "sbatch", "salloc")
    if all(shutil.which(x) for x in needed):
        return None if os.geteuid() == 0 else "not root: slurmd must run as root to start jobs"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "slurm-wlm/munge are not installed and this is not a root Debian machine to apt-get them on"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        lock = ["-o", "DPkg::Lock::Timeout=600"]   # tests/test_multinode.py may be installing them right now
        for cmd in (["apt-get", *lock, "update", "-qq"], ["apt-get", *lock, "install", "-y", "-q", "slurm-wlm", "munge"]):
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            if p.returncode != 0:
                return f"{' '.join(cmd)} failed: {p.stderr[-500:]}"
    except subprocess.TimeoutExpired:
        return "apt-get install slurm-wlm munge took more than 10 minutes"
    return None if all(shutil.which(x) for x in needed) else "apt-get ran but slurmctld is still missing"


def _daemon_pids(state: Path) -> dict[str, int]:
    out = {}
    for name in ("munged", "slurmctld", "slurmd"):
        f = state / "run" / f"{name}.pid"
        if f.exists():
            out[name] = int(f.read_text().strip())
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = _ensure_slurm()
    if reason:
        pytest.skip(f"no real Slurm here ({reason}); the templates are checked in dry-run mode")
    state = tmp_path_factory.mktemp("slurm")
    t0 = time.perf_counter()
    p = _bash(str(SLURM_DIR / "local_slurm.sh"), "start", str(state), timeout=120)
    pids = _daemon_pids(state)
    try:
        assert p.returncode == 0, f"local Slurm did not start:\n{p.stdout}\n{p.stderr}"
        print(f"\n[slurm] daemons up in {time.perf_counter() - t0:.1f} s: {pids}")
        yield state
    finally:
        _bash(str(SLURM_DIR / "local_slurm.sh"), "stop", str(state), timeout=120)
        time.sleep(0.5)
        stray = {n: pid for n, pid in pids.items() if _alive(pid)}
        assert not stray, f"daemons survived the stop: {stray}"
        steps = subprocess.run(["pgrep", "-f", f"slurmstepd.*{state}"], capture_output=True, text=True).stdout
        assert not steps.strip(), f"stray slurmstepd: {steps}"


def _slurm_env(state: Path, **extra) -> dict:
    return _clean_env(SLURM_CONF=str(state / "slurm.conf"), DDLCOURSE_CPU_BIND="none",
                      DDLCOURSE_SRUN_MPI="pmi2", **extra)


def _smoke_case() -> list[str]:
    """The first lab that exists, at smoke scale; the allreduce check while no lab is written yet."""
    from ddlcourse import cases
    names = cases.available()
    return [names[0], "--scale", "smoke"] if names else ["check"]


@pytest.mark.slow
def test_long_pmi1_requests_are_cut(slurm):
    """The cause of the rare PMI start-up failures that tests/slurm_jobs.py retries: Slurm's pmi2 plugin reads a
    PMI-1 request with one read() of 1024 bytes, so a longer put is cut and the value read back is not the one
    put; a PMI-2 request, framed by its length, carries the same value whole."""
    env = _slurm_env(slurm)

    def probe(version: int, length: int) -> str:
        p = subprocess.run(["srun", "--mpi=pmi2", "-n", "1", sys.executable, str(ROOT / "tests" / "pmi_probe.py"),
                            str(version), str(length)], capture_output=True, text=True, env=env, timeout=120)
        return p.stdout.strip()

    assert probe(1, 900) == "ok"                       # a short PMI-1 line: fine
    assert probe(1, 2000) != "ok"                      # a long one is cut: the value read back is not the one put
    assert probe(2, 2000) == "ok"                      # PMI-2 carries it whole


@pytest.mark.slow
def test_lab_batch_job_on_two_tasks(slurm, tmp_path):
    env = _slurm_env(slurm, DDLCOURSE_RESULTS=str(tmp_path / "results"))
    args = _smoke_case()
    t0 = time.perf_counter()
    job_id, info, out = run_batch_job(
        lambda argv: subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60),
        ["--ntasks=2", "--time=15", "--cpus-per-task=1", "--chdir", str(ROOT), str(SLURM_DIR / "lab.sbatch"), *args],
        tmp_path / "job-%j.out", "lab.sbatch on 2 tasks")
    print(f"[slurm] lab.sbatch {' '.join(args)}: job {job_id} done in {time.perf_counter() - t0:.1f} s")
    assert "JobState=COMPLETED" in info, f"{info}\n{out}"
    summary = json.loads((tmp_path / "results" / "slurm" / f"ddl-lab-{job_id}.json").read_text())
    assert summary["exit_code"] == 0 and summary["ntasks"] == 2 and summary["case"] == args[0], summary
    if args[0] != "check":  # the lab's own result file, under $DDLCOURSE_RESULTS/<case>/
        written = list((tmp_path / "results" / args[0]).glob("result*.json"))
        assert written, f"no result*.json under results/{args[0]}:\n{out[-3000:]}"
        json.loads(written[0].read_text())
    if args == ["check"]:
        assert "all three agree with the expected sum [3.0, 3.0, 3.0, 3.0]: True" in out, out


def _mapped_mpich_segments(marker: str) -> set[Path]:
    """/dev/shm/mpich_shm_* files mapped by the processes whose command line holds ``marker``."""
    pids = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            if len(fields) == 6 and fields[5].startswith("/dev/shm/mpich_shm_"):
                found.add(Path(fields[5]))
    return found


@pytest.mark.slow
def test_a_killed_job_of_an_earlier_cluster_does_not_break_the_next_one(tmp_path):
    """MPICH names its shared-memory segment after the PMI kvsname "<job>.<step>", and a job killed by SIGKILL
    leaves it in /dev/shm. When every fresh cluster numbered its jobs from 1, the next cluster's first job
    attached to that stale segment and MPI_Init aborted or hung (the rare "PMI flake" of earlier CI runs).
    local_slurm.sh now starts each cluster at a random FirstJobId: the same sequence must just work."""
    reason = _ensure_slurm()
    if reason:
        pytest.skip(reason)
    marker = f"ddl_stale_segment_{os.getpid()}"
    code = f"from mpi4py import MPI; import time; MPI.COMM_WORLD.Barrier(); print('up', flush=True); time.sleep(300)  # {marker}"
    script = str(SLURM_DIR / "local_slurm.sh")
    stale: set[Path] = set()
    try:
        a = tmp_path / "a"
        assert _bash(script, "start", str(a), timeout=120).returncode == 0
        try:
            env = _slurm_env(a)
            srun = subprocess.Popen(["srun", "--mpi=pmi2", "-n2", "--cpu-bind=none", "--time=5", sys.executable, "-c", code],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
            try:
                assert srun.stdout.readline().strip() == "up", "the first job of cluster A did not start"
                job_a = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                           env=env).stdout.split()[0]
                stale = _mapped_mpich_segments(marker)
                assert stale, "precondition: the running job maps no /dev/shm/mpich_shm_* segment"
                subprocess.run(["scancel", "--signal=KILL", "--full", job_a], env=env, timeout=30)
                srun.wait(timeout=60)
            finally:
                if srun.poll() is None:
                    srun.kill()
                    srun.wait()
            assert all(f.exists() for f in stale), "precondition: SIGKILL left no stale segment behind"
        finally:
            _bash(script, "stop", str(a), timeout=120)

        b = tmp_path / "b"
        assert _bash(script, "start", str(b), timeout=120).returncode == 0
        try:
            env = _slurm_env(b)
            p = subprocess.run(["srun", "--mpi=pmi2", "-n2", "--cpu-bind=none", "--time=5", sys.executable, "-c",
                                "from mpi4py import MPI; print('sum', MPI.COMM_WORLD.allreduce(1))"],
                               capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
            first_b = re.search(r"FirstJobId=(\d+)", (b / "slurm.conf").read_text()).group(1)
        finally:
            _bash(script, "stop", str(b), timeout=120)
        print(f"[slurm] cluster A's first job {job_a} killed, leaving {sorted(f.name for f in stale)}; "
              f"cluster B's first job {first_b}: rc {p.returncode}")
        assert first_b != job_a, "the second cluster numbered its jobs as the first one did"
        assert p.returncode == 0 and p.stdout.split() == ["sum", "2", "sum", "2"], f"{p.stdout}\n{p.stderr[-2000:]}"
    finally:
        for f in stale:
            f.unlink(missing_ok=True)


@pytest.mark.slow
def test_engines_through_srun_inside_salloc(slurm, tmp_path):
    env = _slurm_env(slurm, DDLCOURSE_RUNTIME_DIR=str(tmp_path / "rt"))
    cmd = ["salloc", "-n", "2", "--immediate=120", "--time=10", sys.executable, str(SLURM_DIR / "engines.py")]
    t0 = time.perf_counter()
    p = retry_launch(lambda argv: subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60),
                     "salloc + MPICluster via srun",
                     lambda: subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300))
    print(f"[slurm] salloc + MPICluster via srun: {time.perf_counter() - t0:.1f} s")
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "2 engine(s) on 1 host(s) via srun" in p.stdout
    assert "engines via srun: 2 rank(s); allreduce three ways agree: True" in p.stdout, p.stdout


@pytest.mark.slow
def test_gpu_smoke_dry_run_inside_salloc_and_a_wrong_pmi_plugin(slurm, tmp_path):
    """env/gpu_smoke.sh's srun checks on a real (CPU) Slurm: the detected plugin is offered and gives one MPI
    world; --mpi=none (a plugin that does not match MPICH) gives singletons, and ids.srun FAILs saying so."""
    smoke = ROOT / "env" / "gpu_smoke.sh"
    outs = {}
    for plugin in ("", "none"):
        env = _slurm_env(slurm, DDLCOURSE_RUNTIME_DIR=str(tmp_path / "rt"))
        env.pop("DDLCOURSE_SRUN_MPI")
        if plugin:
            env["DDLCOURSE_SRUN_MPI"] = plugin
        cmd = ["salloc", "-n", "2", "--immediate=120", "--time=10", "bash", str(smoke), "--dry-run",
               "--only", "pmi,ids", "--log-dir", str(tmp_path / f"logs-{plugin or 'auto'}")]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        print(f"[slurm] gpu_smoke --only pmi,ids (DDLCOURSE_SRUN_MPI={plugin or 'detected'}): "
              f"{time.perf_counter() - t0:.1f} s\n{p.stdout}")
        outs[plugin] = p
    good, bad = outs[""], outs["none"]
    assert good.returncode == 0, good.stdout + good.stderr
    assert re.search(r"^PASS pmi +srun --mpi=pmi2: MPICH", good.stdout, re.M)
    assert re.search(r"^PASS ids\.srun +2 rank\(s\) on 1 host\(s\)", good.stdout, re.M)
    assert re.search(r"^PASS ids\.mpiexec +2 rank\(s\) on 1 host\(s\)", good.stdout, re.M)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"^FAIL ids\.srun +2 rank\(s\) expected, the MPI world has 1", bad.stdout, re.M), bad.stdout


@pytest.mark.slow
def test_gpu_smoke_gpu_form_on_cpu_nodes_fails_with_reasons(slurm, tmp_path):
    """The GPU form (no --dry-run) inside an allocation without GPUs: it runs, and every check that needs a
    GPU FAILs with the reason, never a PASS on the CPU."""
    env = _slurm_env(slurm, DDLCOURSE_RUNTIME_DIR=str(tmp_path / "rt"))
    cmd = ["salloc", "-n", "2", "--immediate=120", "--time=10", "bash", str(ROOT / "env" / "gpu_smoke.sh"),
           "--only", "build,ids.srun,check", "--log-dir", str(tmp_path / "logs")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    print(p.stdout)
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(r"^gpu_smoke: GPU allocation; 1 node\(s\), 2 task\(s\)", p.stdout, re.M)
    assert re.search(r"^FAIL build +.*torch sees no GPU", p.stdout, re.M)
    assert re.search(r"^FAIL ids\.srun +.*have no CUDA device", p.stdout, re.M)
    assert re.search(r"^FAIL check +check: FAIL: --require-cuda, but the CUDA allreduces were skipped", p.stdout, re.M)
    assert "0 PASS, 3 FAIL, 0 SKIP" in p.stdout
