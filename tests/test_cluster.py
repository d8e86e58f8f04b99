"""ddlcourse.cluster: start, use and stop MPI clusters; bad input; no stray processes, ever."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlcourse import cluster
from ddlcourse.cluster import forkserver, launch, mpicluster, processes
from ddlcourse.cluster import ClusterError, MPICluster

from helpers import ROOT, module_command

pytestmark = pytest.mark.mpi


def _gone(pids, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(processes.alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _forked(pid: int) -> bool:
    """Whether process ``pid`` was forked by a fork server (its parent runs ddlcourse/cluster/forkserver.py serve)."""
    return b"forkserver.py\0serve" in Path(f"/proc/{_parent(pid)}/cmdline").read_bytes()


def _engine_servers() -> list:
    return [v for k, v in forkserver._SHARED.items() if k[0] == mpicluster.ENGINE_PRELOAD]


def _pids(c: MPICluster):
    state = cluster.recorded_clusters()
    mine = [s for _, s in state if s.get("cluster_id") == c._cluster.cluster_id][0]
    return [p for p in mine["engine_pids"] + mine["launcher_pids"] + [mine["controller_pid"]] if p]


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True])
def test_bad_n_is_a_clear_error(n):
    with pytest.raises(ValueError, match="positive integer"):
        MPICluster(n=n)


@pytest.mark.parametrize("end, said", [("exit 3", "exited with code 3"), ("kill -9 $$", "was killed by SIGKILL")])
def test_a_launcher_that_ends_before_its_engines_register_says_how_it_ended(tmp_path, end, said):
    """A silent launcher exit (no output to read) still says how it ended: its exit code, or the signal that
    killed it (something outside the cluster)."""
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nsleep 1\n{end}\n")
    fake.chmod(0o755)
    c = MPICluster(n=2, timeout=60, mpiexec=str(fake), quiet=True)
    with pytest.raises(ClusterError, match=f"the launcher .mpiexec. {said} after 0 of 2 engines registered"):
        c.start()
    assert not c.running


def test_bad_timeout_and_launcher():
    with pytest.raises(ValueError, match="timeout"):
        MPICluster(n=1, timeout=0)
    with pytest.raises(ClusterError, match="unknown launcher"):
        cluster.launch_command(2, launcher="pbs")


def test_no_mpiexec_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DDLCOURSE_MPIEXEC", str(tmp_path / "missing"))
    with pytest.raises(ClusterError, match="not an executable"):
        cluster.find_mpiexec()
    monkeypatch.delenv("DDLCOURSE_MPIEXEC")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(ClusterError, match="no mpiexec found"):
        cluster.find_mpiexec()


def test_launch_command_defaults(monkeypatch):
    for v in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_NPROCS"):
        monkeypatch.delenv(v, raising=False)
    kind, cmd, args = cluster.launch_command(2)
    assert kind == "mpiexec" and cmd[0].endswith("mpiexec")
    assert args[:2] == ["-bind-to", "none"] and "OMP_NUM_THREADS" in args
    assert cluster.default_n() == 2
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert cluster.default_n() == 8
    monkeypatch.setenv("PATH", "/nonexistent")
    # in an allocation but without srun on PATH, auto falls back to mpiexec
    assert cluster.launch_command(2, mpiexec="/bin/true")[0] == "mpiexec"


def test_engines_that_never_come_up_time_out_and_leave_nothing(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'fake mpiexec: pretending to launch'\nexec sleep 300\n")
    fake.chmod(0o755)
    c = MPICluster(n=2, timeout=3, mpiexec=str(fake), quiet=True)
    t0 = time.time()
    with pytest.raises(ClusterError, match="only 0 of 2 engines registered within 3 s") as e:
        c.start()
    assert "fake mpiexec" in str(e.value)
    assert time.time() - t0 < 40
    assert not c.running
    assert c._state_file is not None and not c._state_file.exists()   # its record is gone (others may run)
    out = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True, text=True).stdout.split()
    assert out == [], f"fake mpiexec still running: {out}"


def test_start_report_run_stop_leaves_no_process(capsys):
    with MPICluster(n=2) as c:
        ranks = c.report()
        assert [r.rank for r in ranks] == [0, 1]
        assert all(r.size == 2 and r.device == "cpu" for r in ranks)
        assert c.run(os.getpid) == [r.pid for r in ranks]  # view ordered by rank
        import torch
        assert c.run(torch.get_num_threads) == [1, 1]
        # the engines run ddlcourse.cluster.engine, forked from the fork server (on one host)
        assert [Path(a).parts[-2:] for a in c.run(eval, "__import__('sys').argv[0]")] == [("cluster", "engine.py")] * 2
        assert all(_forked(r.pid) for r in ranks)
        # and so are their nannies (ddlcourse.cluster.engine.start_forked_nanny): the server's other two children
        clients = c.run(eval, "__import__('ipyparallel.engine.app').engine.app.IPEngine.instance().nanny_pipe.pid")
        assert all(b"forkserver.py\0run" in Path(f"/proc/{p}/cmdline").read_bytes() for p in clients)
        assert all(Path(f"/proc/{p}/cmdline").read_bytes().endswith(b"ddlcourse.cluster.engine\0--nanny\0") for p in clients)
        server = psutil.Process(_parent(ranks[0].pid))
        nannies = {p.pid for p in server.children()} - {r.pid for r in ranks}
        assert len(nannies) == 2, nannies
        pids = _pids(c) + [*clients, *nannies]
        assert len(pids) >= 8  # 2 engines, mpiexec, controller, 2 nannies and their clients
    assert not c.running
    assert _gone(pids, timeout=5), "processes survive a normal stop"
    assert "MPI cluster stopped" in capsys.readouterr().out
    c.stop()  # idempotent


def test_run_calls_progress_while_it_waits_and_gives_up_after_its_timeout():
    """run() is the one path to the engines: progress is called while they work; past its timeout it says which
    ranks answered (and what), and the cluster goes on serving the next call once the slow rank is done."""
    calls = []
    slow = "__import__('time').sleep(2.5 * __import__('mpi4py.MPI').MPI.COMM_WORLD.Get_rank()) or 7"
    with MPICluster(n=2, quiet=True) as c:
        assert c.run(eval, slow, progress=lambda: calls.append(1)) == [7, 7]
        assert calls, "progress was never called while rank 1 slept for 2.5 s"
        with pytest.raises(cluster.RanksTimeout) as err:
            c.run(eval, slow, timeout=1)
        assert err.value.answered == {0: 7} and err.value.pending == [1]
        assert "no answer from rank(s) [1] within 1 s (1 of 2 answered)" in str(err.value)
        assert c.run(eval, "6 * 7") == [42, 42]


def test_the_engine_fork_server_serves_the_next_cluster_and_stops_at_exit():
    """One server per process (and per threads-per-rank): a second cluster's engines are forked from it too,
    with a fresh MPI world and fresh pids; forkserver.stop_shared (run at exit) ends it and removes its folder."""
    forkserver.stop_shared()
    worlds = []
    for _ in range(2):
        with MPICluster(n=2, quiet=True) as c:
            worlds.append([(r.pid, _parent(r.pid)) for r in c.ranks])
            from ddlcourse import dist
            assert c.run(dist.rank) == [0, 1]
    (server, sock), = _engine_servers()
    assert {ppid for world in worlds for _, ppid in world} == {server.pid}, worlds
    assert len({pid for world in worlds for pid, _ in world}) == 4
    assert server.poll() is None, "a cluster's stop must leave the process's fork server running"
    forkserver.stop_shared()
    assert server.poll() is not None and not os.path.exists(os.path.dirname(sock))
    assert not _engine_servers()


def test_engines_start_fresh_without_the_fork_server(monkeypatch):
    monkeypatch.setattr(mpicluster, "ENGINE_FORK", False)
    with MPICluster(n=2, quiet=True) as c:
        assert not any(_forked(r.pid) for r in c.ranks)
        assert [Path(a).parts[-2:] for a in c.run(eval, "__import__('sys').argv[0]")] == [("cluster", "engine.py")] * 2


def test_exception_inside_with_block_still_stops():
    with pytest.raises(ZeroDivisionError):
        with MPICluster(n=2, quiet=True) as c:
            pids = _pids(c)
            1 / 0
    assert _gone(pids, timeout=5)
    with pytest.raises(ClusterError, match="not running"):
        c.view


def test_a_rank_killed_before_the_call_is_named_not_a_key_error():
    """Once the client has taken in the hub's notice that an engine died, ipyparallel raises KeyError while
    building the targets (NoEnginesRegistered once mpiexec took the other rank down with it); run names the dead
    rank instead (this raced in the two-node test)."""
    from ddlcourse import dist
    with MPICluster(n=2, quiet=True) as c:
        victim = c.ranks[-1]
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.time() + 20
        while time.time() < deadline and victim.engine_id in c.client.ids:
            time.sleep(0.2)
        assert victim.engine_id not in c.client.ids, "the hub never noticed the dead engine"
        with pytest.raises(ClusterError, match=f"engine.s. gone: .*rank {victim.rank} on .*pid {victim.pid}"):
            c.run(dist.rank)


def test_oversubscription_warns_and_four_ranks_form_one_world():
    if cluster.available_cores() >= 4:
        pytest.skip("needs fewer than 4 cores to oversubscribe")
    with pytest.warns(UserWarning, match="oversubscribed"):
        c = cluster.start(n=4, quiet=True)
    try:
        from ddlcourse import dist
        assert c.run(dist.rank) == [0, 1, 2, 3]
    finally:
        c.stop()


def test_killed_kernel_is_cleaned_up_by_the_watchdog(tmp_path):
    """A process that starts a cluster and dies by SIGKILL (as nbval kills kernels) leaves nothing."""
    p = subprocess.run(module_command("cluster_killed_kernel"), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == -signal.SIGKILL, p.stderr
    import json
    st = json.loads(p.stdout.strip().splitlines()[-1])
    pids = [q for q in st["engine_pids"] + st["launcher_pids"] + [st["controller_pid"]] if q]
    assert len(pids) >= 4
    assert _gone(pids, timeout=20), "the watchdog did not stop the orphaned cluster"
    server, sock = st["server"]
    assert _gone([server], timeout=5), "the engines' fork server outlived the process that started it"
    assert not os.path.exists(os.path.dirname(sock)), "the fork server left its folder behind"
    deadline = time.time() + 10      # the watchdog removes the record right after the processes
    while any(s.get("cluster_id") == st["cluster_id"] for _, s in cluster.recorded_clusters()) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(s.get("cluster_id") == st["cluster_id"] for _, s in cluster.recorded_clusters())


def test_stop_all_kills_recorded_orphans(tmp_path):
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    import json
    (tmp_path / "cluster-x.json").write_text(json.dumps(
        {"cluster_id": "x", "parent_pid": 999999999, "launcher_pids": [sleeper.pid], "engine_pids": []}))
    assert cluster.stop_all(tmp_path, only_orphans=True) == 1
    sleeper.wait(timeout=5)
    assert not list(tmp_path.glob("cluster-*.json"))


def test_launch_flags_fit_the_launcher(monkeypatch, tmp_path):
    """srun: --overlap (a second step of the allocation must not wait behind the engines) and, with GPUs,
    --gpu-bind=none; mpiexec: Hydra's flags for MPICH, Open MPI's own for Open MPI (it rejects -genv)."""
    for name, version in (("ompi", "mpiexec (Open MPI) 5.0.3"), ("hydra", "HYDRA build details:")):
        exe = tmp_path / name / "mpiexec"
        exe.parent.mkdir()
        exe.write_text(f"#!/bin/sh\necho '{version}'\n")
        exe.chmod(0o755)
    _, _, ompi = cluster.launch_command(2, launcher="mpiexec", mpiexec=str(tmp_path / "ompi" / "mpiexec"))
    assert ompi == ["--bind-to", "none", "-x", "OMP_NUM_THREADS=1", "-x", "DDLCOURSE_THREADS=1"]
    _, _, hydra = cluster.launch_command(2, launcher="mpiexec", mpiexec=str(tmp_path / "hydra" / "mpiexec"))
    assert hydra[:2] == ["-bind-to", "none"] and "-genv" in hydra
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", str(srun.parent))
    monkeypatch.setenv("DDLCOURSE_SRUN_MPI", "pmi2")
    for v in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_PER_NODE"):
        monkeypatch.delenv(v, raising=False)
    _, _, args = cluster.launch_command(2, launcher="srun")
    assert "--overlap" in args and "--mpi=pmi2" in args and "--gpu-bind=none" not in args
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    assert "--gpu-bind=none" in cluster.launch_command(2, launcher="srun")[2]


# ----------------------------------------------------------------- a start broken inside Slurm's PMI (issue 29)
PMI_CUT = "slurmstepd-node2: error: mpi/pmi2: invalid client request"


def test_a_start_broken_in_slurms_pmi_is_started_again_and_said(monkeypatch, capsys):
    """srun's pmi2 plugin cuts a long PMI-1 request now and then (launch.PMI_CUT_SIGNS): start again, say so."""
    tries = []

    def start_once(fails: int, launcher: str = "srun", text: str = PMI_CUT):
        def fake(self):
            tries.append(1)
            self._launcher_kind = launcher
            if len(tries) <= fails:
                raise ClusterError(f"the launcher (srun) exited. Launcher output:\n{text}")
            return self
        monkeypatch.setattr(MPICluster, "_start_once", fake)

    c = MPICluster(n=2, quiet=True)
    start_once(fails=2)
    assert c.start() is c and len(tries) == 3
    err = capsys.readouterr().err
    assert "attempt 1 of 3" in err and "attempt 2 of 3" in err and "Slurm's PMI" in err
    for fails, launcher, text, calls in [(5, "srun", PMI_CUT, 3),              # gives up after 3, with the error
                                          (1, "srun", "ValueError: bad batch", 1),  # another error: at once
                                          (1, "mpiexec", PMI_CUT, 1)]:          # not srun's plugin: at once
        tries.clear()
        start_once(fails, launcher, text)
        with pytest.raises(ClusterError):
            c.start()
        assert len(tries) == calls, (launcher, text)


@pytest.mark.parametrize("then", ["hangs", "exits"])
def test_an_srun_start_broken_in_slurms_pmi_gives_up_in_seconds_and_starts_again(then, tmp_path, monkeypatch,
                                                                                  capsys):
    """After a cut PMI request the ranks either wait on the PMI fence forever (each start gives up PMI_CUT_GRACE s
    after the sign appeared in srun's output, not at its 120 s timeout), or MPI_Init aborts and srun exits 1
    (ipyparallel says "Engine set stopped"). Either way: a ClusterError with srun's output, 3 launches in all,
    nothing left running."""
    fake = tmp_path / "bin"
    fake.mkdir()
    launches = tmp_path / "launches"
    end = "exec sleep 307" if then == "hangs" else "exit 1"
    (fake / "srun").write_text(f"#!/bin/sh\necho launch >> {launches}\necho '{PMI_CUT}' >&2\n{end}\n")
    for tool in ("squeue", "scancel"):
        (fake / tool).write_text("#!/bin/sh\nexit 0\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("DDLCOURSE_SRUN_MPI", "pmi2")
    # hangs: a short grace, so that the grace is what ends each start; exits: a long one, so that it is the exit
    monkeypatch.setattr(mpicluster, "PMI_CUT_GRACE", 1.0 if then == "hangs" else 60.0)
    c = MPICluster(n=2, launcher="srun", timeout=120, quiet=True)
    t0 = time.time()
    said = "broke inside Slurm's PMI" if then == "hangs" else "launcher .srun. exited with code 1 after 0 of 2"
    with pytest.raises(ClusterError, match=said) as e:
        c.start()
    assert PMI_CUT in str(e.value)
    assert launches.read_text().split() == ["launch"] * 3
    assert time.time() - t0 < 110, "the starts waited for their timeout (120 s) instead of giving up early"
    assert "attempt 2 of 3" in capsys.readouterr().err
    assert not c.running
    left = subprocess.run(["pgrep", "-f", "sleep 307"], capture_output=True, text=True).stdout.split()
    assert left == [], f"a fake srun is still running: {left}"


def test_an_engine_started_before_its_controller_reads_only_a_whole_connection_file(tmp_path, monkeypatch):
    """On one host the engines start with the controller (ddlcourse.cluster.engine waits for its file while it imports)."""
    import threading

    from ddlcourse.cluster import engine
    monkeypatch.setenv("IPP_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("IPP_CLUSTER_ID", "ddl-1234")
    monkeypatch.delenv("IPP_CONNECTION_INFO", raising=False)
    path = engine.connection_file()
    assert path == tmp_path / "security" / "ipcontroller-ddl-1234-engine.json"
    path.parent.mkdir()
    path.write_text('{"interface": "tcp://127.0.0.1", "regis')        # the controller is writing it
    assert not engine.wait_for_connection_file(path, timeout=0.2)      # half a file is not a file
    threading.Timer(0.3, lambda: path.write_text('{"interface": "tcp://127.0.0.1", "registration": 5}')).start()
    t0 = time.monotonic()
    assert engine.wait_for_connection_file(path, timeout=10)
    assert 0.25 < time.monotonic() - t0 < 5
    # engines on other hosts get the connection in their environment: nothing to wait for
    monkeypatch.setenv("IPP_CONNECTION_INFO", "{}")
    assert engine.connection_file() is None


def test_engines_wait_for_the_controller_only_across_hosts(monkeypatch):
    seen = {}

    def fake_start_controller(self):
        seen["send_env"] = self._cluster.send_engines_connection_env
        raise ClusterError("stop here")

    monkeypatch.setattr(mpicluster.ipp.Cluster, "start_controller_sync", lambda c: fake_start_controller(mpc),
                        raising=False)
    mpc = MPICluster(n=2, quiet=True, launcher="mpiexec")
    with pytest.raises(ClusterError, match="stop here"):
        mpc._start_once()
    assert seen["send_env"] is False          # one host: the engines start with the controller


def _fake_launcher(folder: Path, script: str) -> tuple[list[str], Path]:
    """A launcher command whose every launch appends a line to the returned file, then runs ``script`` (sh)."""
    folder.mkdir(exist_ok=True)
    launches = folder / "launches"
    exe = folder / "fake-srun"
    exe.write_text(f"#!/bin/sh\necho launch >> {launches}\nn=$(wc -l < {launches})\n{script}\n")
    exe.chmod(0o755)
    return [str(exe)], launches


def test_a_job_whose_start_broke_in_slurms_pmi_is_started_again_and_its_output_returned(tmp_path, capsys):
    """run_job (a kernel's own MPI job, e.g. the Horovod timeline): a launch that shows the PMI signs and hangs
    is ended cut_grace s after them and started again, said on stderr; one that exits with them is started again
    at once; the first launch that ends well is returned with its output."""
    cmd, launches = _fake_launcher(tmp_path, f"""echo "rank output $n"
[ "$n" = 1 ] && {{ echo '{PMI_CUT}' >&2; exec sleep 309; }}
[ "$n" = 2 ] && {{ echo '{PMI_CUT}' >&2; exit 1; }}
exit 0""")
    t0 = time.monotonic()
    p = launch.run_job(cmd, timeout=60, what="the test job", cut_grace=1.0)
    assert p.returncode == 0 and "rank output 3" in p.stdout and PMI_CUT not in p.stdout
    assert launches.read_text().split() == ["launch"] * 3
    assert time.monotonic() - t0 < 30, "the hanging launch was not ended soon after its PMI signs"
    err = capsys.readouterr().err
    assert "the test job: MPI start-up broke inside Slurm's PMI" in err and "attempt 2 of 3" in err
    left = subprocess.run(["pgrep", "-f", "sleep 309"], capture_output=True, text=True).stdout.split()
    assert left == [], f"the ended launch is still running: {left}"


def test_a_job_that_fails_otherwise_is_returned_at_once_and_one_that_hangs_is_ended_with_its_output(tmp_path):
    cmd, launches = _fake_launcher(tmp_path, "echo 'ValueError: bad batch' >&2; exit 3")
    p = launch.run_job(cmd, timeout=60, cut_grace=1.0)
    assert p.returncode == 3 and "ValueError: bad batch" in p.stdout
    assert launches.read_text().split() == ["launch"], "a failure that is not PMI's was launched again"

    cmd, launches = _fake_launcher(tmp_path / "hang", "echo 'step 1 of 3'; sleep 311 & wait")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"(?s)the job did not finish in 2 s, and was ended.*step 1 of 3"):
        launch.run_job(cmd, timeout=2, what="the job")
    assert time.monotonic() - t0 < 20
    left = subprocess.run(["pgrep", "-f", "sleep 311"], capture_output=True, text=True).stdout.split()
    assert left == [], f"the launcher's child is still running: {left}"
    # signs of a broken start on the last launch: it is not launched a fourth time, and its failure is returned
    cmd, launches = _fake_launcher(tmp_path / "last", f"echo '{PMI_CUT}' >&2; exit 1")
    p = launch.run_job(cmd, timeout=60, cut_grace=1.0)
    assert p.returncode == 1 and launches.read_text().split() == ["launch"] * 3
