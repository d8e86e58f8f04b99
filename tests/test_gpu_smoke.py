"""env/gpu_smoke.sh, the instructor's GPU smoke test, in its dry-run form on CPU ranks; and the pieces of
ddlcourse.checks it stands on (placement rules, the srun PMI plugin, engines per scale, agreement).

No GPU here: the dry run really runs every check that does not need one (with mpiexec), and SKIPs the
others with "no GPU". Deliberately broken runs (an unknown lab, a launcher that starts singletons) must
give FAIL lines and a non-zero exit.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ddlcourse import checks
from ddlcourse.cluster import launch

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "env" / "gpu_smoke.sh"


def _env(**extra) -> dict:
    """This environment without Slurm job variables (the test may run inside a job), the venv's Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env.pop("DDLCOURSE_SMOKE_DRY_RUN", None)
    env.update(DDLCOURSE_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _smoke(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SMOKE), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env or _env(), timeout=timeout)


def _lines(out: str) -> dict[str, tuple[str, str]]:
    """``{check id: (PASS|FAIL|SKIP, rest of the line)}`` from the script's output."""
    got = {}
    for line in out.splitlines():
        m = re.match(r"^(PASS|FAIL|SKIP) +(\S+) +(.*)$", line)
        if m:
            got[m.group(2)] = (m.group(1), m.group(3))
    return got


# ------------------------------------------------------------------------------------------ the script
def test_syntax_list_and_usage_errors():
    assert subprocess.run(["bash", "-n", str(SMOKE)]).returncode == 0
    p = _smoke("--list")
    ids = p.stdout.split()
    assert p.returncode == 0 and ids[:5] == ["build", "pmi", "ids.srun", "ids.mpiexec", "check"]
    for case in ("maize", "seismic", "topology", "driving"):
        assert f"lab.{case}.ddp" in ids and f"lab.{case}.horovod" in ids
    assert ids[-3:] == ["bench.ddp", "bench.horovod", "nbval"]
    bad = _smoke("--dry-run", "--only", "ids,nosuchcheck")
    assert bad.returncode == 2 and "--only nosuchcheck matches no check" in bad.stderr
    # the GPU form outside an allocation refuses to start, and says what to do
    noalloc = _smoke("--only", "check")
    assert noalloc.returncode == 2 and "not inside a Slurm allocation" in noalloc.stderr and "--dry-run" in noalloc.stderr


@pytest.mark.mpi
@pytest.mark.slow
def test_dry_run_fast_subset_passes_and_skips_what_needs_a_gpu(tmp_path):
    logs = tmp_path / "logs"
    p = _smoke("--only", "build,ids,check,profile,plan,lab.maize.ddp", "--log-dir", str(logs),
               env=_env(DDLCOURSE_SMOKE_DRY_RUN="1"))
    print(p.stdout[-3000:], p.stderr[-2000:])
    got = _lines(p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr
    assert got["build"][0] == "SKIP" and "no GPU" in got["build"][1]
    assert got["ids.srun"][0] == "SKIP" and "no Slurm allocation" in got["ids.srun"][1]
    assert got["ids.mpiexec"] == ("PASS", got["ids.mpiexec"][1]) and "2 rank(s) on 1 host(s)" in got["ids.mpiexec"][1]
    assert got["check"][0] == "PASS" and "CUDA allreduces skipped: no CUDA" in got["check"][1]
    assert got["lab.maize.ddp"][0] == "PASS" and "2 ranks via mpiexec" in got["lab.maize.ddp"][1]
    assert got["profile"][0] == "PASS" and got["profile"][1].startswith("2 ranks: ") and "3 steps" in got["profile"][1]
    assert got["plan"] == ("SKIP", "no GPU (dry run on CPU ranks)")
    assert set(got) == {"build", "ids.srun", "ids.mpiexec", "check", "profile", "plan", "lab.maize.ddp"}  # --only
    assert f"logs in {logs}" in p.stdout and "4 PASS, 0 FAIL, 3 SKIP" in p.stdout
    # each check's log holds what its line was judged on
    ids_log = (logs / "ids.mpiexec.log").read_text()
    # rank, host, local rank, device, GPU, CUDA_VISIBLE_DEVICES (emptied by the dry run)
    assert re.search(r'^ +0 +\S+ +0 cpu +- +"" \(no GPU visible\)$', ids_log, re.M), ids_log
    assert re.search(r'^ +1 +\S+ +1 cpu +- +"" \(no GPU visible\)$', ids_log, re.M), ids_log
    check_log = (logs / "check.log").read_text()
    assert "all three agree with the expected sum [3.0, 3.0, 3.0, 3.0]: True" in check_log
    assert "rank 1 (cpu): cuda tensor via Horovod: skipped (no CUDA)" in check_log
    assert re.search(r"rank 0 \(cpu\): cpu tensor via torch.distributed \(default group, \S+\): \[3.0, 3.0, 3.0, 3.0\] ok",
                     check_log)
    assert list((logs / "results" / "ddp" / "maize").glob("result*.json")), "the lab wrote no result under the log dir"
    assert (logs / "summary.txt").read_text().splitlines()[-1].startswith("gpu_smoke: 4 PASS, 0 FAIL, 3 SKIP")
    # the profile read each of notebook 24's phases once per step on both ranks
    assert len(re.findall(r"^profile: rank [01] of 2 on cpu: 3 steps; forward .* ms, backward .* ms, optimizer .* ms, "
                          r"allreduce .* ms; exposed", (logs / "profile.log").read_text(), re.M)) == 2


def test_local_form_takes_one_rank_per_gpu_of_this_machine_and_skips_what_needs_slurm(tmp_path):
    """--local: a machine with GPUs and no Slurm (a workstation, a lone GPU server)."""
    none = _smoke("--local", "--only", "pmi", env=_env(PATH=f"{tmp_path}:{os.environ['PATH']}"))
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\necho 'GPU 1: Fake GPU (UUID: GPU-1)'\n")
    fake.chmod(0o755)
    if "GPU " not in subprocess.run(["sh", "-c", "nvidia-smi -L || true"], capture_output=True, text=True).stdout:
        assert none.returncode == 2 and "nvidia-smi lists no GPU" in none.stderr and "--dry-run" in none.stderr
    p = _smoke("--local", "--only", "pmi,ids.srun,sbatch,nbval", "--log-dir", str(tmp_path / "logs"),
               env=_env(PATH=f"{tmp_path}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_NTASKS="8"))
    got = _lines(p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "this machine's GPUs (--local, no Slurm); 1 node(s), 2 task(s), 2 per node, 2 GPU(s) per node" in p.stdout
    assert "launcher mpiexec" in p.stdout
    for id in ("pmi", "ids.srun", "sbatch.lab", "sbatch.engines"):
        assert got[id] == ("SKIP", "no Slurm allocation (srun) here"), (id, p.stdout)
    # the notebooks start up to 4 engines, one per GPU: two GPUs are too few, and that is not a failure here
    assert got["nbval"][0] == "SKIP" and "one per GPU; this machine has 2" in got["nbval"][1]


@pytest.mark.mpi
def test_a_lab_that_does_not_exist_fails_the_run(tmp_path):
    p = _smoke("--dry-run", "--only", "lab.nosuchcase.ddp", "--log-dir", str(tmp_path),
               env=_env(DDLCOURSE_SMOKE_CASES="nosuchcase"))
    got = _lines(p.stdout)
    assert p.returncode == 1, p.stdout + p.stderr
    assert got["lab.nosuchcase.ddp"][0] == "FAIL" and "unknown case 'nosuchcase'" in got["lab.nosuchcase.ddp"][1]
    assert str(tmp_path / "lab.nosuchcase.ddp.log") in got["lab.nosuchcase.ddp"][1]
    assert "0 PASS, 1 FAIL, 0 SKIP" in p.stdout and "FAILED: lab.nosuchcase.ddp" in p.stdout


@pytest.mark.mpi
def test_a_launcher_that_starts_singletons_fails_ids_and_check(tmp_path):
    """What a wrong srun --mpi plugin does: N processes that each are rank 0 of a world of 1."""
    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/bash\n'
                    'if [ "$1" = --version ]; then echo "singleton launcher"; exit 0; fi\n'
                    'n=$2; shift 2; pids=()\n'
                    'for i in $(seq "$n"); do "$@" & pids+=($!); done\n'
                    'rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc\n')
    fake.chmod(0o755)
    p = _smoke("--dry-run", "--only", "ids.mpiexec,check", "--log-dir", str(tmp_path / "logs"),
               env=_env(DDLCOURSE_MPIEXEC=str(fake)))
    got = _lines(p.stdout)
    assert p.returncode == 1, p.stdout + p.stderr
    assert got["ids.mpiexec"][0] == "FAIL" and "the MPI world has 1" in got["ids.mpiexec"][1]
    assert "DDLCOURSE_SRUN_MPI" in got["ids.mpiexec"][1]
    assert got["check"][0] == "FAIL" and "2 rank(s) expected, the MPI world has 1" in got["check"][1]


@pytest.mark.mpi
def test_a_launch_whose_mpi_init_aborts_is_retried_once_and_says_so(tmp_path):
    """pip's MPICH under srun --mpi=pmi2 rarely aborts in MPI_Init at launch. The script runs such a launch once
    more and says so on the check's line; a second abort is a FAIL."""
    fake = tmp_path / "mpiexec"     # the real mpiexec, but every launch before the marker exists aborts like MPICH
    real = subprocess.run([sys.executable, "-c", "from ddlcourse.cluster import find_mpiexec; print(find_mpiexec())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    fake.write_text('#!/bin/bash\n'
                    f'if [ "$1" = --version ]; then exec {real} --version; fi\n'
                    f'if [ ! -e {tmp_path}/marker-$ABORTS ]; then touch {tmp_path}/marker-$ABORTS; '
                    '  echo "Abort(811222414) on node 0: Fatal error in internal_Init_thread: Message truncated"; exit 15; fi\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    once = _smoke("--dry-run", "--only", "ids.mpiexec", "--log-dir", str(tmp_path / "logs"),
                  env=_env(DDLCOURSE_MPIEXEC=str(fake), ABORTS="1"))
    got = _lines(once.stdout)
    assert once.returncode == 0, once.stdout + once.stderr
    assert got["ids.mpiexec"][0] == "PASS" and "MPI_Init aborted at the first launch, retried once" in got["ids.mpiexec"][1]
    assert "internal_Init_thread" in (tmp_path / "logs" / "ids.mpiexec.first.log").read_text()
    # a launcher that aborts every time: no endless retries, a FAIL
    fake.write_text(fake.read_text().replace(f"if [ ! -e {tmp_path}/marker-$ABORTS ]", "if true"))
    always = _smoke("--dry-run", "--only", "ids.mpiexec", "--log-dir", str(tmp_path / "logs2"),
                    env=_env(DDLCOURSE_MPIEXEC=str(fake), ABORTS="2"))
    assert always.returncode == 1 and _lines(always.stdout)["ids.mpiexec"][0] == "FAIL", always.stdout


# ------------------------------------------------------------------------------------------ checks.py
def _row(rank, host, local, gpu=None, size=4, node_rank=None):
    return dict(rank=rank, size=size, host=host, local_rank=local, node_rank=local if node_rank is None else node_rank,
                node_size=2, device=f"cuda:{local}" if gpu else "cpu", gpu=gpu, gpu_name="X" if gpu else None,
                n_visible=2, cuda_visible_devices="0,1", problem=None)


def test_placement_rules():
    good = [_row(0, "a", 0, "GPU-a0"), _row(1, "a", 1, "GPU-a1"), _row(2, "b", 0, "GPU-b0"), _row(3, "b", 1, "GPU-b1")]
    assert checks.placement_problems(good, expect_ranks=4, require_gpu=True) == []
    # the same physical GPU id on two hosts is fine; on one host it is not
    shared = [_row(0, "a", 0, "GPU-x"), _row(1, "a", 1, "GPU-x"), _row(2, "b", 0, "GPU-b0"), _row(3, "b", 1, "GPU-b1")]
    assert any("ranks 0 and 1 share one GPU" in p for p in checks.placement_problems(shared))
    # every rank of a node reads local rank 0 (a launcher variable inherited from the job step)
    inherited = [_row(0, "a", 0), _row(1, "a", 0, node_rank=1), _row(2, "b", 0), _row(3, "b", 0, node_rank=1)]
    probs = checks.placement_problems(inherited, expect_ranks=4)
    assert any("a: local ranks are [0, 0]" in p for p in probs)
    assert any("rank 1 uses local rank 0 but is number 1" in p for p in probs)
    # CPU ranks pass on CPU, and fail where GPUs are required
    cpu = [_row(0, "a", 0, size=2), _row(1, "a", 1, size=2)]
    assert checks.placement_problems(cpu, expect_ranks=2) == []
    assert any("have no CUDA device" in p for p in checks.placement_problems(cpu, 2, require_gpu=True))
    alone = [_row(0, "a", 0, size=1)]
    assert any("own MPI world of size 1" in p for p in checks.placement_problems(alone, expect_ranks=4))


@pytest.mark.parametrize("version, plugin", [
    ("MPICH Version:      5.0.2\nMPICH Release date: ...", "pmi2"),
    ("Open MPI v5.0.3, package: Open MPI ...", "pmix"),
    ("Open MPI v4.1.6, package: ...", "pmix"),
    ("MPI VERSION    : CRAY MPICH version 8.1.28.29 (ANL base 3.4a2)", "cray_shasta"),
    ("Intel(R) MPI Library 2021.11 for Linux* OS", "pmi2"),
    ("MVAPICH2 Version      :\t2.3.7", "pmi2"),
    ("Some Vendor MPI 1.0", "pmi2"),
])
def test_srun_mpi_plugin_follows_the_mpi(version, plugin, monkeypatch):
    monkeypatch.delenv("DDLCOURSE_SRUN_MPI", raising=False)
    got, why = launch.srun_mpi_plugin(version)
    assert got == plugin and why
    monkeypatch.setenv("DDLCOURSE_SRUN_MPI", "pmix_v4")
    assert launch.srun_mpi_plugin(version)[0] == "pmix_v4"


def test_srun_mpi_plugin_of_this_venv(monkeypatch):
    """The venv's mpi4py runs on the mpich wheel: pmi2, asked without initialising MPI in this process."""
    monkeypatch.delenv("DDLCOURSE_SRUN_MPI", raising=False)
    assert "MPICH" in launch.mpi_library_version()
    p = subprocess.run([sys.executable, "-m", "ddlcourse", "srun-mpi", "--explain"], capture_output=True,
                       text=True, env=_env(), cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "pmi2" and "MPICH" in p.stderr


def test_engines_needed_and_allocation_advice():
    from ddlcourse import config
    smoke = checks.engines_needed("smoke")
    s12e = config.sizes("native_sharding_checkpoints", "smoke")
    peak = max(smoke.values())
    assert smoke["setup_check"] == 2 and smoke["native_sharding_checkpoints"] == max(s12e.n_load, s12e.n_save)
    cluster = checks.engines_needed("cluster")
    assert cluster["setup_check"] == 8
    assert checks.allocation_advice("smoke", peak, gpus_per_node=peak, tasks_per_node=peak) == []
    small = checks.allocation_advice("smoke", 2)
    assert len(small) == 1 and f"Ask for at least {peak} tasks" in small[0]
    shared = checks.allocation_advice("smoke", 8, gpus_per_node=2, tasks_per_node=4)
    assert len(shared) == 1 and "ranks will share GPUs" in shared[0]


def test_engines_needed_counts_every_cluster_alive_at_once():
    """Notebook 26 stops its n_load-engine cluster before a second one of n_save engines saves the checkpoint, so the
    two never add up (the synthetic notebook below shows clusters alive together do)."""
    from ddlcourse import config
    nb = ROOT / "notebooks" / "26_native_sharding_checkpoints.ipynb"
    for scale in config.SCALES:
        s = config.sizes("native_sharding_checkpoints", scale)
        found = checks.notebook_clusters(nb, scale)
        assert found["section"] == "native_sharding_checkpoints"
        assert [(c["n"], c["expr"], c["exact"], c["alive_with"]) for c in found["clusters"]][:2] == \
            [(s.n_load, "S.n_load", True, []), (s.n_save, "S.n_save", True, [])]
        assert found["peak"] == max(s.n_load, s.n_save)
        assert checks.engines_needed(scale)["native_sharding_checkpoints"] == max(s.n_load, s.n_save)
    # clusters one after the other (notebook 23's with-blocks, notebook 25's stop-then-restart) do not add up
    for name in ("23_mixed_precision.ipynb", "25_fault_tolerance.ipynb", "27_data_pipeline.ipynb"):
        found = checks.notebook_clusters(ROOT / "notebooks" / name, "cluster")
        assert len(found["clusters"]) >= 2 and all(c["alive_with"] == [] for c in found["clusters"]), name
        assert found["peak"] == config.sizes(found["section"], "cluster").n_ranks, name
    # every start the scan meets reads its n, except 08's max(ranks) (bounded by S.n_ranks)
    inexact = {(p.name, c["expr"]) for p in checks.notebook_paths()
               for c in checks.notebook_clusters(p, "cluster")["clusters"] if not c["exact"]}
    assert inexact == {("13_scaling.ipynb", "max(ranks)")}


def test_notebook_clusters_reads_lifetimes(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        'S = config.sizes("native_sharding_checkpoints")',
        "a = cluster.start(n=S.n_load)\nb = cluster.MPICluster(n=3)\nb.start()",
        "b.stop()\nwith cluster.MPICluster(n=max(S.n_save, 1)) as c:\n    c.run(f)",
        "d = cluster.start(n=len(hosts))",            # not readable: the section's largest n_* (n_load), not exact
        "a.stop()\nd.stop()\nwith cluster.MPICluster(n=2) as e:\n    pass",
    )]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    found = checks.notebook_clusters(path, "smoke")
    assert [(c["n"], c["exact"], c["alive_with"]) for c in found["clusters"]] == \
        [(4, True, []), (3, True, [0]), (2, True, [0]), (4, False, [0]), (2, True, [])]
    assert found["peak"] == 8                       # a and d: 4 + 4


def test_agree_counts_device_allreduces():
    base = {"mpi4py": [3.0], "torch.distributed": [3.0], "horovod": [3.0]}
    ok = {"name": "cpu tensor", "status": "ok", "value": [3.0], "detail": ""}
    skipped = {"name": "cuda tensor", "status": "skipped", "value": None, "detail": checks.SKIP_NO_CUDA}
    error = {"name": "cpu tensor", "status": "error", "value": None, "detail": "RuntimeError: no backend"}
    assert checks.agree([dict(base, devices=[ok, skipped])] * 2, 2, 1)
    assert not checks.agree([dict(base, devices=[ok, skipped])] * 2, 2, 1, require_cuda=True)
    assert not checks.agree([dict(base, devices=[error])] * 2, 2, 1)
    assert checks.agree([base] * 2, 2, 1)  # results without device allreduces (older callers) still agree


@pytest.mark.mpi
def test_a_pass_whose_log_has_a_launch_error_fails_and_a_cluster_error_warns(tmp_path):
    """The final pass over the logs: a LaunchError (or a timeout) in a PASSed check's log makes it a FAIL;
    a ClusterError makes it a WARN (notebook 25 provokes one on purpose)."""
    real = subprocess.run([sys.executable, "-c", "from ddlcourse.cluster import find_mpiexec; print(find_mpiexec())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/bash\n'
                    f'if [ "$1" = --version ]; then exec {real} --version; fi\n'
                    'echo "$SAY"\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    for say, status, rc in (("ddlcourse.cluster.LaunchError: engines did not start", "FAIL", 1),
                            ("ClusterError: engine 1 died", "WARN", 0)):
        p = _smoke("--dry-run", "--only", "ids.mpiexec", "--log-dir", str(tmp_path / status),
                   env=_env(DDLCOURSE_MPIEXEC=str(fake), SAY=say))
        lines = [ln for ln in p.stdout.splitlines() if " ids.mpiexec " in ln]
        assert p.returncode == rc, p.stdout + p.stderr
        assert lines[0].startswith("PASS") and lines[-1].startswith(status) and say in lines[-1], p.stdout
    assert "1 WARN" in p.stdout


# ------------------------------------------------------------------------------------------ nbval_cluster's time limit
def _bash_function(name: str) -> str:
    """The text of gpu_smoke.sh's function ``name``: from ``name() {`` to the first ``}`` that starts a line."""
    lines = SMOKE.read_text().splitlines()
    start = lines.index(f"{name}() {{")
    return "\n".join(lines[start:lines.index("}", start) + 1])


def _call(name: str, root: Path, *notebooks: str) -> subprocess.CompletedProcess:
    """gpu_smoke.sh's function ``name`` alone, with the script's variables it reads (run from ``root``)."""
    variables = dict(PY=sys.executable, ROOT=str(root), SUMMARY=str(root / "now.txt"))
    script = "".join(f"{k}={shlex.quote(v)}\n" for k, v in variables.items()) + \
        f"NOTEBOOKS=({' '.join(map(shlex.quote, notebooks))})\n{_bash_function(name)}\n{name}\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=root,
                          env=_env(PYTHONPATH=str(ROOT)), timeout=120)


def _notebook(path: Path, header: str, *code: str) -> None:
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(header), *map(nbformat.v4.new_code_cell, code)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def test_the_cluster_pass_limits_follow_the_model(tmp_path):
    """1.5 x (a notebook's laptop time from its header, 3x for a lab, 5 minutes without a figure; + 60 s a cluster)."""
    _notebook(tmp_path / "notebooks" / "a.ipynb", "**Part 1** · about 2 minutes at laptop scale (on 2 CPU cores)",
              "c = cluster.start(n=2)", "c.stop()")
    _notebook(tmp_path / "notebooks" / "b.ipynb", "# no time given")
    _notebook(tmp_path / "labs" / "c.ipynb", "**Lab 1 of 4** · about 5 minutes at laptop scale")
    p = _call("cluster_limits", tmp_path, "notebooks", "labs")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(round(1.5 * (120 + 60 + 300 + 3 * 300))), str(round(1.5 * 3 * 300))]


def test_the_cluster_pass_limit_is_measured_once_a_pass_was(tmp_path):
    """The longest nbval_cluster PASS of earlier summaries, but not one the log check turned into a FAIL."""
    assert _call("measured_cluster_pass", tmp_path).stdout == ""
    runs = {"a": ["PASS nbval_cluster          notebooks labs at cluster scale: 37 passed; limit 9 s [1234.5 s]"],
            "b": ["PASS nbval_cluster          notebooks labs at cluster scale: 37 passed [5000.0 s]",
                  "FAIL nbval_cluster          was PASS, but its log has: timed out"],
            "c": ["SKIP nbval_cluster          the notebooks start up to 8 engines", "PASS check    4 ranks [99.0 s]"]}
    for run, lines in runs.items():
        (tmp_path / "results" / "gpu_smoke" / run).mkdir(parents=True)
        (tmp_path / "results" / "gpu_smoke" / run / "summary.txt").write_text("\n".join(lines) + "\n")
    assert _call("measured_cluster_pass", tmp_path).stdout.strip() == "1234"


def test_the_modelled_cluster_pass_fits_the_allocation_with_the_other_checks():
    """The course's own notebooks: nbval_cluster's limit, and nbval's at smoke scale (4 x 900 s), fit #SBATCH --time."""
    p = _call("cluster_limits", ROOT, "notebooks", "labs")
    assert p.returncode == 0, p.stderr
    pass_s, cell_s = map(int, p.stdout.split())
    h, m, s = map(int, re.search(r"^#SBATCH --time=(\d+):(\d+):(\d+)$", SMOKE.read_text(), re.M).groups())
    assert 0 < cell_s < pass_s and pass_s + 4 * 900 < 3600 * h + 60 * m + s, (pass_s, cell_s)
    text = SMOKE.read_text()
    assert 'run_logged nbval_cluster "$pass_s"' in text and '--nbval-cell-timeout "$cell_s"' in text
    doc = (ROOT / "env" / "GPU_CLUSTER.md").read_text()     # the figures env/GPU_CLUSTER.md quotes are these
    for figure in (f"gives {round(pass_s / 1.5)} s", f"the limit is {pass_s} s", f"({cell_s} s,", f"{pass_s} s before"):
        assert figure in doc, figure
