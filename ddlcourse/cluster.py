"""Start and stop an ipyparallel cluster of MPI engines from a notebook.

Two ways to use it::

    from ddlcourse import cluster
    with cluster.MPICluster(n=2) as c:          # stopped on exit, also when a cell raises
        print(c.view.apply(lambda: 1 + 1))

    c = cluster.start(n=2)                      # or a pair of calls
    ...
    c.stop()

What it does for you (and why):

* uses the environment's own ``mpiexec`` (the ``mpich`` wheel in the course venv), or the cluster's
  MPI / ``srun`` inside a Slurm allocation, so a launch never picks up another MPI by accident;
* ``-bind-to none`` and one torch/OpenMP thread per rank: oversubscribed ranks on a laptop otherwise
  fight over cores and a step becomes 20x slower;
* a private profile directory per cluster, so nothing is written into ``~/.ipython``;
* a blocking ``DirectView`` whose engines are ordered by MPI rank, and ``%px`` set up for
  repeatable output;
* a clean stop with no stray processes: engines are shut down, ``mpiexec`` is awaited, then the
  controller is stopped. A small watchdog process stops everything if the Python process that
  started the cluster dies (a killed or restarted kernel), and :func:`stop_all` clears whatever a
  crash left behind.

Across nodes (a Slurm allocation of several nodes, or a host file): the controller listens on every
interface so that engines on other nodes reach it, ``srun`` ends the whole step when one engine dies
(``--kill-on-bad-exit``), :meth:`MPICluster.run` turns a dead engine into a :class:`ClusterError` within
seconds instead of a hang, and cleanup signals only processes of this host; engines on other nodes are
stopped through their launcher (``srun``/``mpiexec``) and, if that is gone, by cancelling the Slurm steps
the cluster started (``scancel JOB.STEP``).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ipyparallel.serialize.canning import CannedObject

from ddlcourse import checks

DEFAULT_TIMEOUT = 120.0  # seconds for all engines to register
ENGINE_NAMES = ("ipengine", "ipcontroller", "ipyparallel.engine", "ipyparallel.controller",
                "hydra_pmi_proxy", "mpiexec")


class ClusterError(RuntimeError):
    """A cluster could not be started or used."""


# --------------------------------------------------------------------------- discovery
def runtime_dir() -> Path:
    """Where running clusters are recorded (``$DDLCOURSE_RUNTIME_DIR`` or ``~/.cache/ddlcourse/clusters``)."""
    d = os.environ.get("DDLCOURSE_RUNTIME_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ddlcourse", "clusters")
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


def in_slurm_allocation() -> bool:
    """True inside ``salloc``/``sbatch`` (a job id and a task count are set)."""
    return bool(os.environ.get("SLURM_JOB_ID")) and bool(
        os.environ.get("SLURM_NTASKS") or os.environ.get("SLURM_NPROCS"))


def find_mpiexec() -> str:
    """The ``mpiexec`` to launch with.

    Order: ``$DDLCOURSE_MPIEXEC``; the one beside this Python (the course venv's mpich wheel);
    the first on ``PATH`` (a cluster's module-loaded MPI).
    """
    explicit = os.environ.get("DDLCOURSE_MPIEXEC")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ClusterError(f"$DDLCOURSE_MPIEXEC={explicit!r} is not an executable file")
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("mpiexec")
    if on_path:
        return on_path
    raise ClusterError(
        "no mpiexec found: not beside this Python and not on PATH. Run 'make setup' (the course venv "
        "ships MPICH), 'module load' your site's MPI, or set DDLCOURSE_MPIEXEC.")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def allocation_tasks() -> int | None:
    """Tasks of this Slurm allocation (``SLURM_NTASKS``, inside a step ``SLURM_STEP_NUM_TASKS``), else None."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None
    for var in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"):
        v = os.environ.get(var, "").strip()
        if v.isdigit():
            return int(v)
    return None


def allocation_nodes() -> int:
    """Nodes of this Slurm allocation (``SLURM_JOB_NUM_NODES``), 1 outside one."""
    v = (os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "").strip()
    return int(v) if in_slurm_allocation() and v.isdigit() else 1


def default_n() -> int:
    """Number of engines when none is given: the Slurm task count in an allocation, else 2."""
    if in_slurm_allocation():
        return allocation_tasks() or 1
    return 2


def may_span_hosts(launcher: str) -> bool:
    """Whether engines started by ``launcher`` may run on other hosts than the controller.

    ``srun`` always may; ``mpiexec`` does inside a Slurm allocation of several nodes (MPICH's Hydra and
    Open MPI read the node list and start ranks there) or with a host file (``$HYDRA_HOST_FILE``,
    ``$PBS_NODEFILE``). ``$DDLCOURSE_MULTI_HOST=1`` says so for any other set-up.
    """
    if os.environ.get("DDLCOURSE_MULTI_HOST", "") not in ("", "0"):
        return True
    if launcher == "srun":
        return True
    return allocation_nodes() > 1 or bool(os.environ.get("HYDRA_HOST_FILE") or os.environ.get("PBS_NODEFILE"))


def launch_command(n: int, launcher: str = "auto", threads_per_rank: int = 1,
                   mpiexec: str | None = None) -> tuple[str, list[str], list[str]]:
    """Decide how to launch ``n`` ranks: ``(launcher, mpi_cmd, mpi_args)``.

    ``launcher`` is ``"mpiexec"`` (the venv's or site's MPI), ``"srun"`` (Slurm), or ``"auto"``:
    ``srun`` inside a Slurm allocation when it is on PATH, else ``mpiexec``.
    """
    if launcher == "auto":
        launcher = "srun" if in_slurm_allocation() and shutil.which("srun") else "mpiexec"
    threads = str(threads_per_rank)
    if launcher == "srun":
        srun = shutil.which("srun")
        if not srun:
            raise ClusterError("launcher='srun' but srun is not on PATH (are you on a Slurm login/compute node?)")
        # --cpus-per-task spreads the threads; the PMI plugin must match the MPI mpi4py was built with.
        # --kill-on-bad-exit: one dead engine breaks the MPI world, so end the whole step at once (on every
        # node) rather than leave the others waiting in a collective.
        # --overlap: the engines' step shares its nodes' CPUs and GPUs with later steps of the allocation (a
        # second cluster, a Horovod timeline job); without it those steps wait until the engines stop.
        args = ["--overlap", "--cpu-bind=none", f"--cpus-per-task={threads}", "--kill-on-bad-exit=1",
                f"--export=ALL,OMP_NUM_THREADS={threads},DDLCOURSE_THREADS={threads}"]
        if allocation_has_gpus():
            args.append("--gpu-bind=none")        # every rank sees its node's GPUs; dist maps local rank -> GPU
        plugin = _srun_mpi()
        if plugin:
            args.append(f"--mpi={plugin}")
        return "srun", [srun], args
    if launcher == "mpiexec":
        exe = mpiexec or find_mpiexec()
        env = {"OMP_NUM_THREADS": threads, "DDLCOURSE_THREADS": threads}
        if mpiexec_flavor(exe) == "openmpi":
            args = ["--bind-to", "none"] + [a for k, v in env.items() for a in ("-x", f"{k}={v}")]
        else:                                     # MPICH's Hydra (the venv's), Intel MPI, MVAPICH2
            args = ["-bind-to", "none"] + [a for k, v in env.items() for a in ("-genv", k, v)]
        return "mpiexec", [exe], args
    raise ClusterError(f"unknown launcher {launcher!r}; use 'auto', 'mpiexec' or 'srun'")


def allocation_has_gpus() -> bool:
    """Whether this Slurm allocation holds GPUs (Slurm sets these variables when it gives GRES)."""
    return any(os.environ.get(v, "").strip() not in ("", "0")
               for v in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_PER_NODE"))


_FLAVORS: dict[str, str] = {}


def mpiexec_flavor(exe: str) -> str:
    """``"openmpi"``, ``"mpich"`` (Hydra: MPICH, Intel MPI, MVAPICH2) or ``"unknown"``: their flags differ.

    From the name the launcher links to (``mpiexec.hydra``, ``orterun``/``prterun``), else ``--version``."""
    if exe not in _FLAVORS:
        real = os.path.basename(os.path.realpath(exe))
        if real in ("orterun", "prterun", "prte", "mpirun.openmpi"):
            _FLAVORS[exe] = "openmpi"
        elif "hydra" in real or real == "mpiexec.mpich":
            _FLAVORS[exe] = "mpich"
        else:
            try:
                out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            _FLAVORS[exe] = ("openmpi" if any(w in out for w in ("Open MPI", "OpenRTE", "PRRTE")) else
                             "mpich" if any(w in out for w in ("HYDRA", "MPICH", "Intel(R) MPI")) else "unknown")
    return _FLAVORS[exe]


_SRUN_MPI: dict = {}


def _srun_mpi() -> str | None:
    """srun's ``--mpi`` plugin: ``$DDLCOURSE_SRUN_MPI``, else the one matching mpi4py's MPI (asked once).

    Without it, srun uses the site's ``MpiDefault`` (often ``none``): every engine is then an MPI world of
    its own. A notebook started inside ``salloc`` has no template to set the variable for it.
    """
    if os.environ.get("DDLCOURSE_SRUN_MPI", "").strip():
        return os.environ["DDLCOURSE_SRUN_MPI"].strip()
    if "plugin" not in _SRUN_MPI:
        try:
            _SRUN_MPI["plugin"] = checks.srun_mpi_plugin()[0]
        except Exception as e:  # no mpi4py here: leave the choice to the site's MpiDefault
            warnings.warn(f"could not tell which srun --mpi plugin mpi4py needs ({e}); using the site's "
                          "default. Set DDLCOURSE_SRUN_MPI (see env/slurm/README.md).", stacklevel=3)
            _SRUN_MPI["plugin"] = None
    return _SRUN_MPI["plugin"]


# --------------------------------------------------------------------------- process bookkeeping
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _this_host() -> str:
    return socket.gethostname()


def _split_engines(state: dict) -> tuple[list[int], list[tuple[str, int]]]:
    """``(pids of engines on this host, [(host, pid)] of engines on other hosts)`` from a state file."""
    pids = [p for p in state.get("engine_pids", []) or []]
    hosts = state.get("engine_hosts")
    if not isinstance(hosts, list) or len(hosts) != len(pids):  # a record without hosts: one host, the recorder's
        hosts = [state.get("host") or _this_host()] * len(pids)
    here = _this_host()
    return ([p for p, h in zip(pids, hosts) if p and h == here],
            [(h, p) for p, h in zip(pids, hosts) if p and h != here])


def _slurm_steps(job: str) -> dict[str, str]:
    """``{step id "JOB.STEP": step name}`` of the running steps of Slurm job ``job`` ({} without Slurm)."""
    if not (job and shutil.which("squeue")):
        return {}
    try:
        p = subprocess.run(["squeue", "-h", "-s", "-j", str(job), "-o", "%i %j"], capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    steps = {}
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        step, _, name = line.strip().partition(" ")
        if step.startswith(f"{job}."):
            steps[step] = name
    return steps


def _cancel_steps(state: dict) -> list[str]:
    """``scancel`` the Slurm steps that launched the engines, where they still run; returns those cancelled.

    Engines on other nodes are not this host's processes: Slurm stops them, on every node of the step.
    """
    job, steps = state.get("slurm_job"), state.get("slurm_steps") or []
    running = _slurm_steps(job) if steps else {}
    alive = [s for s in steps if s in running]
    if alive and shutil.which("scancel"):
        try:
            subprocess.run(["scancel", "--quiet", *alive], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        deadline = time.time() + 15
        while time.time() < deadline and set(alive) & set(_slurm_steps(job)):
            time.sleep(0.2)
    return alive


def _kill_recorded(state: dict, grace: float = 2.0) -> bool:
    """Terminate everything a state file records: engines, launcher process groups, controller.

    Only processes of this host are signalled by PID; a PID recorded on another node names some other
    process here. Engines elsewhere end with their launcher (``srun`` forwards the signal to every task,
    ``mpiexec`` to its proxies) and, if it is gone or they outlive it, with ``scancel`` of the Slurm steps
    the cluster started. Returns False when the record belongs to another host and nothing could be done
    from here (no Slurm step to cancel): the caller should leave it for a run on that host.
    """
    here = _this_host()
    recorded_on = state.get("host") or here
    if recorded_on != here:
        # launcher, controller and "local" engines all live on the host that wrote the record
        cancelled = _cancel_steps(state)
        return bool(cancelled)
    pids, _ = _split_engines(state)  # engines elsewhere: through their launcher, or scancel below
    groups = [p for p in (state.get("launcher_pids", []) + [state.get("controller_pid")]) if p]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pgid in groups:
            try:
                os.killpg(pgid, sig)  # launchers run in their own session: the group holds mpiexec & proxies
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.time() + grace
        while time.time() < deadline and any(_alive(p) for p in pids + groups):
            time.sleep(0.05)
        if not any(_alive(p) for p in pids + groups):
            break
    _cancel_steps(state)  # remote engines whose launcher could not take them down
    profile = state.get("profile_dir")
    if profile and state.get("owns_profile_dir"):
        shutil.rmtree(profile, ignore_errors=True)
    return True


def recorded_clusters(directory: Path | str | None = None) -> list[tuple[Path, dict]]:
    d = Path(directory) if directory else runtime_dir()
    out = []
    for f in sorted(d.glob("cluster-*.json")):
        try:
            out.append((f, json.loads(f.read_text())))
        except (OSError, json.JSONDecodeError):
            out.append((f, {}))
    return out


def stop_all(directory: Path | str | None = None, only_orphans: bool = False) -> int:
    """Stop every cluster recorded in ``directory`` (default :func:`runtime_dir`). Returns how many.

    ``only_orphans=True`` keeps clusters whose starting process is still alive.
    """
    n = 0
    here = _this_host()
    for f, state in recorded_clusters(directory):
        foreign = (state.get("host") or here) != here   # a shared home: recorded on another node
        if only_orphans and (foreign or state.get("parent_pid") and _alive(state["parent_pid"])):
            continue  # whether a process of another host is alive cannot be told from here
        if not _kill_recorded(state):
            continue
        f.unlink(missing_ok=True)
        n += 1
    return n


def find_processes(marker_var: str = "DDLCOURSE_TEST_RUN", marker: str | None = None,
                   names: tuple[str, ...] = ENGINE_NAMES) -> list[tuple[int, str]]:
    """Processes of this user whose command line names an engine/controller/MPI launcher.

    With ``marker``, only those whose environment has ``marker_var=marker`` (a test run's tag).
    """
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if not cmd or not any(name in cmd for name in names):
                continue
            if marker is not None:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                if f"{marker_var}={marker}".encode() not in env:
                    continue
            found.append((int(entry), cmd))
        except OSError:
            continue
    return found


# --------------------------------------------------------------------------- the cluster
@dataclass
class RankInfo:
    rank: int
    size: int
    host: str
    pid: int
    local_rank: int
    device: str
    engine_id: int = -1


# The hub completes an engine's registration only after the engine has answered its heartbeats: with
# ipyparallel's default period of 3 s a 2-engine start took 8.3 s (median of 5, quiet 2-core machine), 6 s of it
# waiting; at 0.5 s it takes 3.4 s (env/bench_cluster.py --heartbeat-ms 3000 1000 500 250 shows it). 60 missed
# beats (30 s) before an engine counts as dead, as ipyparallel's 10 x 3 s.
HEARTBEAT_MS, HEARTBEAT_MISSES = 500, 60


def _describe_engine() -> dict:  # runs on an engine
    from ddlcourse import dist
    return dist.describe()


@dataclass
class MPICluster:
    """An ipyparallel cluster of ``n`` MPI engines (see the module docstring).

    Parameters
    ----------
    n : number of engines (MPI ranks). Default: ``$SLURM_NTASKS`` in an allocation, else 2.
    timeout : seconds to wait for every engine to register before giving up (and cleaning up).
    launcher : ``"auto"``, ``"mpiexec"`` or ``"srun"`` (see :func:`launch_command`).
    threads_per_rank : torch/OpenMP threads per rank (default 1, or ``$SLURM_CPUS_PER_TASK``).
    mpiexec : path of the ``mpiexec`` to use (default :func:`find_mpiexec`).
    quiet : do not print the start/stop lines.
    """

    n: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    launcher: str = "auto"
    threads_per_rank: int | None = None
    mpiexec: str | None = None
    quiet: bool = False
    ranks: list[RankInfo] = field(default_factory=list, init=False)

    def __post_init__(self):
        if self.n is None:
            self.n = default_n()
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be a positive integer number of engines, got {self.n!r}")
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.threads_per_rank is None:
            self.threads_per_rank = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
        self._cluster = None
        self._rc = None
        self._view = None
        self._state_file: Path | None = None
        self._watchdog: subprocess.Popen | None = None
        self._profile_dir: str | None = None
        self._launcher_kind: str | None = None
        self._slurm_job: str | None = None
        self._steps_before: set[str] = set()
        self.start_seconds = float("nan")
        self.start_phases: dict[str, float] = {}   # seconds per phase of the last start
        self.stop_seconds = float("nan")
        self.engine_output = ""  # what the engines printed, kept by a clean stop() instead of logged

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "MPICluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._cluster is not None

    def start(self) -> "MPICluster":
        import ipyparallel as ipp

        if self.running:
            return self
        send_notebook_classes_by_value()
        launcher, mpi_cmd, mpi_args = launch_command(self.n, self.launcher, self.threads_per_rank, self.mpiexec)
        self._check_allocation(launcher)
        cores = available_cores()
        if launcher == "mpiexec" and not may_span_hosts(launcher) and self.n * self.threads_per_rank > cores:
            warnings.warn(
                f"{self.n} ranks x {self.threads_per_rank} thread(s) on {cores} core(s): the ranks are "
                "oversubscribed. Results are correct, but timings measure time-sharing, not scaling.",
                stacklevel=2)
        t0 = time.perf_counter()
        self.ranks = []  # a restarted cluster must not record the PIDs of its previous engines
        cid = f"ddl-{uuid.uuid4().hex[:8]}"
        self._profile_dir = tempfile.mkdtemp(prefix=f"ipp-{cid}-", dir=runtime_dir())
        # Engines on other nodes must reach the controller: it listens on every interface then, and tells
        # the engines its hostname (ipyparallel's default location). On one host, loopback only.
        multi_host = may_span_hosts(launcher)
        self._cluster = ipp.Cluster(
            engines="mpi", n=self.n, profile_dir=self._profile_dir, cluster_id=cid,
            controller_ip="*" if multi_host else "127.0.0.1",
            log_level=logging.ERROR, engine_timeout=int(self.timeout),
            controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}",
                             f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"],
        )
        self._launcher_kind = launcher
        if launcher == "srun":
            mpi_args = [*mpi_args, f"--job-name={cid}"]  # the step's name: how cleanup finds it (scancel)
        self._slurm_job = os.environ.get("SLURM_JOB_ID") if in_slurm_allocation() else None
        self._steps_before = set(_slurm_steps(self._slurm_job)) if self._slurm_job else set()
        cfg = self._cluster.config
        cfg.MPIEngineSetLauncher.mpi_cmd = mpi_cmd
        cfg.MPIEngineSetLauncher.mpi_args = mpi_args
        cfg.MPIEngineSetLauncher.environment = {"OMP_NUM_THREADS": str(self.threads_per_rank),
                                                "DDLCOURSE_THREADS": str(self.threads_per_rank)}
        self._state_file = runtime_dir() / f"cluster-{cid}.json"
        phases, mark = {}, [t0]

        def phase(name):        # seconds per start-up phase (env/bench_cluster.py prints them)
            now = time.perf_counter()
            phases[name] = now - mark[0]
            mark[0] = now

        phase("configure")
        try:
            self._cluster.start_controller_sync()
            self._record()
            phase("controller")
            self._cluster.start_engines_sync(n=self.n)
            self._record()
            self._start_watchdog()
            phase("launch")
            self._rc = self._cluster.connect_client_sync()
            phase("client")
            self._wait_for_engines(mpi_cmd[0])
            phase("engines registered")
            self._setup_engines()
            self._record()
            phase("engines described")
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - t0
        self.start_phases = phases
        if not self.quiet:
            hosts = sorted({r.host for r in self.ranks})
            print(f"MPI cluster: {self.n} engine(s) on {len(hosts)} host(s) via {launcher}, "
                  f"{self.threads_per_rank} thread(s) per rank")
        return self

    def _wait_for_engines(self, launcher_exe: str) -> None:
        """Wait for every engine to register; fail at once if the launcher exits first (an engine's MPI_Init
        failed, srun refused the step), rather than after the whole timeout."""
        deadline = time.perf_counter() + self.timeout
        while True:
            try:
                self._rc.wait_for_engines(self.n, timeout=min(1.0, max(0.01, deadline - time.perf_counter())),
                                          interactive=False)
                return
            except TimeoutError:
                pass
            got = len(self._rc.ids)
            ended = [es for es in self._cluster.engines.values() if not es.running]
            if ended or time.perf_counter() >= deadline:
                why = (f"the launcher ({self._launcher_kind}) exited after {got} of {self.n} engines registered"
                       if ended else f"only {got} of {self.n} engines registered within {self.timeout:.0f} s")
                raise ClusterError(
                    f"{why}. Launcher output:\n{self._launcher_output() or '(none)'}\n"
                    "Try fewer engines, a longer timeout, or check that the launcher runs: "
                    f"{launcher_exe} -n 2 python -c 'print(1)'")

    def _check_allocation(self, launcher: str) -> None:
        """Refuse more engines than the Slurm allocation has tasks (srun would wait, or fail obscurely)."""
        tasks = allocation_tasks() if in_slurm_allocation() else None
        if tasks is None or self.n <= tasks:
            return
        job = os.environ.get("SLURM_JOB_ID")
        if launcher == "srun":
            raise ClusterError(
                f"{self.n} engines asked for, but this Slurm allocation (job {job}) has {tasks} task(s) "
                f"(SLURM_NTASKS={tasks}), and srun starts one engine per task. Ask for at most {tasks} "
                f"(MPICluster(n={tasks}), or leave n out to use every task), or request more tasks: "
                f"salloc/sbatch --ntasks={self.n} (or --nodes=N --ntasks-per-node=K with N*K >= {self.n}).")
        warnings.warn(
            f"{self.n} engines in a Slurm allocation of {tasks} task(s) (job {job}): mpiexec will put more "
            "ranks than tasks on the nodes, oversubscribing their CPUs. Use n <= SLURM_NTASKS for timings.",
            stacklevel=3)

    def _setup_engines(self) -> None:
        rc = self._rc
        dview = rc[:]
        dview.block = True
        info = dview.apply_sync(_describe_engine)
        ranks = [RankInfo(engine_id=eid, **d) for eid, d in zip(rc.ids, info)]
        ranks.sort(key=lambda r: r.rank)
        if sorted(r.rank for r in ranks) != list(range(self.n)) or any(r.size != self.n for r in ranks):
            raise ClusterError(
                f"engines do not form one MPI world of size {self.n}: got ranks "
                f"{[(r.rank, r.size) for r in ranks]}. Is mpi4py built against the mpiexec used ({self.mpiexec or find_mpiexec()})?")
        self.ranks = ranks
        self._view = rc[[r.engine_id for r in ranks]]  # ordered by MPI rank
        self._view.block = True
        self._configure_px()

    def _configure_px(self) -> None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        ip = get_ipython()
        if ip is None:
            return
        self._view.activate()
        ip.run_line_magic("pxconfig", "--no-stream --progress-after -1")

    def _launcher_output(self) -> str:
        try:
            return "".join(es.get_output() or "" for es in self._cluster.engines.values())[-3000:]
        except Exception:  # best effort, for error messages only
            return ""

    def _record(self) -> None:
        c = self._cluster
        state = {
            "cluster_id": c.cluster_id,
            "profile_dir": self._profile_dir,
            "owns_profile_dir": True,
            "parent_pid": os.getpid(),
            "controller_pid": getattr(c.controller, "pid", None) if c.controller else None,
            "launcher_pids": [getattr(es, "pid", None) for es in c.engines.values()],
            "engine_pids": [r.pid for r in self.ranks],
            "engine_hosts": [r.host for r in self.ranks],   # a PID means something only on its host
            "host": _this_host(),                            # where the controller and launcher run
            "slurm_job": self._slurm_job,
            "slurm_steps": self._our_steps(),
            "n": self.n,
            "started": time.time(),
        }
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self._state_file)

    def _our_steps(self) -> list[str]:
        """The Slurm steps this cluster's launcher started (srun: named after the cluster; Hydra: its proxies)."""
        if not self._slurm_job or self._cluster is None or not self._cluster.engines:
            return []
        cid = self._cluster.cluster_id
        new = {s: name for s, name in _slurm_steps(self._slurm_job).items() if s not in self._steps_before}
        if self._launcher_kind == "srun":
            return sorted(s for s, name in new.items() if name == cid)
        return sorted(new)   # mpiexec: Hydra's own srun step of proxies, unnamed; new since we started

    def _start_watchdog(self) -> None:
        # A separate session, so it survives the kernel being killed and then cleans up.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "ddlcourse._watchdog", str(os.getpid()), str(self._state_file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop engines, mpiexec and controller; safe to call twice and from any state."""
        if self._cluster is None:
            return
        t0 = time.perf_counter()
        c = self._cluster
        try:
            asked = False
            if self._rc is not None and any(es.running for es in c.engines.values()):
                try:  # not block=True: an engine that died but is still registered never answers
                    self._rc.shutdown(hub=False, block=False, targets="all")
                    asked = True
                except Exception:
                    pass
            # wait for mpiexec/srun to exit on its own once the engines are gone (clean MPI_Finalize)
            for es in list(c.engines.values()) if asked else []:
                proc = getattr(es, "process", None)
                if proc is not None:
                    try:
                        proc.wait(timeout=10)
                    except Exception:
                        pass
            if self._rc is not None:
                try:
                    self._rc.close()
                except Exception:
                    pass
            if asked:
                # A stop we asked for: mpiexec may still exit non-zero (an engine slower than the wait above is
                # signalled), and ipyparallel would then print the engines' whole log (kilobytes) as a WARNING
                # into the notebook. Keep it in self.engine_output instead; an engine that died is reported
                # by run() and the watchdog, not here.
                for es in c.engines.values():
                    es._log_output = self._keep_output(es)
            try:
                c.stop_cluster_sync()
            except Exception:
                pass
        finally:
            state = json.loads(self._state_file.read_text()) if self._state_file and self._state_file.exists() else {}
            _kill_recorded(state)  # anything still alive (normally nothing)
            if self._state_file:
                self._state_file.unlink(missing_ok=True)
            if self._profile_dir:
                shutil.rmtree(self._profile_dir, ignore_errors=True)
            if self._watchdog is not None:
                self._watchdog.terminate()
                try:
                    self._watchdog.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._watchdog.kill()
            try:
                atexit.unregister(self.stop)
            except Exception:
                pass
            self._cluster = self._rc = self._view = self._watchdog = None
            self.stop_seconds = time.perf_counter() - t0
            if not self.quiet:
                print(f"MPI cluster stopped ({self.n} engine(s)).")

    def _keep_output(self, launcher):
        def log_output(stop_data=None):
            try:
                out = launcher.get_output(remove=True)
            except Exception as e:   # the output file may already be gone
                out = f"(engine output unavailable: {e})"
            self.engine_output = out
            launcher.log.debug("Output for %s (exit %s):\n%s", launcher.identifier,
                               (stop_data or {}).get("exit_code"), out)
        return log_output

    # -- use ---------------------------------------------------------------------------------
    def _need(self):
        if self._cluster is None:
            raise ClusterError("the cluster is not running: call start() or use 'with MPICluster(...)'")

    @property
    def view(self):
        """A blocking DirectView over all engines, ordered by MPI rank."""
        self._need()
        return self._view

    @property
    def client(self):
        self._need()
        return self._rc

    def run(self, fn, *args, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        ``fn`` should be importable (a function from ``ddlcourse``) rather than defined in a cell.
        """
        self._need()
        try:
            ar = self._view.apply_async(fn, *args, **kwargs)
        except Exception:  # KeyError or NoEnginesRegistered: the client took in the hub's notice of a death
            gone = self._dead_engines()
            if gone:
                raise ClusterError(gone) from None
            raise
        while True:
            try:
                return ar.get(timeout=0.5)
            except TimeoutError:
                pass
            except Exception:
                gone = self._dead_engines()
                if gone:  # ipyparallel's "EngineError: engine died": say what happened and what to do
                    raise ClusterError(gone) from None
                raise
            gone = self._dead_engines()
            if gone:  # the live ranks may wait forever in a collective with the dead one: do not wait
                raise ClusterError(gone)

    def _dead_engines(self) -> str | None:
        """None while every engine and its launcher run; else a sentence saying what died and what to do."""
        try:
            ids = set(self._rc.ids)  # reading ids takes in the hub's notices of engines that went away
        except Exception:
            ids = None
        gone = [r for r in self.ranks if ids is not None and r.engine_id not in ids]
        ended = [es for es in self._cluster.engines.values() if not es.running]
        if not gone and not ended:
            return None
        what = ", ".join(f"rank {r.rank} on {r.host} (pid {r.pid})" for r in gone) or "the engines"
        how = ""
        if ended:
            code = getattr(ended[0], "stop_data", None) or {}
            how = (f"; the launcher ({self._launcher_kind}) exited"
                   + (f" with {code.get('exit_code')}" if isinstance(code, dict) and "exit_code" in code else ""))
        return (f"engine(s) gone: {what}{how}. One dead rank breaks the MPI world (the others would wait for "
                "it in every collective), so this cluster cannot be used any more: call c.stop() and start a "
                "new one. Look at the launcher output for the cause (killed, out of memory, node failure):\n"
                f"{self._launcher_output()[-1500:] or '(no output)'}")

    def report(self, show: bool = True) -> list[RankInfo]:
        """Which rank runs on which host and device."""
        self._need()
        if show:
            print(f"{'rank':>4}  {'local':>5}  {'host':<20} {'device':<10}")
            for r in self.ranks:
                print(f"{r.rank:>4}  {r.local_rank:>5}  {r.host:<20} {r.device:<10}")
        return self.ranks

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"MPICluster(n={self.n}, launcher={self.launcher!r}, {state})"


# --------------------------------------------------------------------------- the learner's classes, to the engines
class CannedByValue(CannedObject):
    """A class defined in a notebook, pickled by value with cloudpickle (with the globals its methods use).
    At module level: the engines unpickle it by this name."""

    def __init__(self, cls):
        import cloudpickle
        self.data, self.buffers = cloudpickle.dumps(cls), []

    def get_object(self, g=None):
        import cloudpickle
        return cloudpickle.loads(self.data)


def send_notebook_classes_by_value() -> None:
    """Let ipyparallel send a torch module or autograd Function class defined in a notebook (a learner's MyDDP or
    MySyncBatchNorm) to the engines. By default it sends a notebook's class as its methods, one by one: a method
    that calls ``super()`` holds the class in a closure cell and the canning recurses for ever, the methods look
    their globals (``tdist``) up in the engine's namespace, where the notebook's imports are missing, and an
    autograd Function (its own metaclass) is pickled by name, which the engines cannot find. Such classes go by
    value, with cloudpickle; every other object as before. Called by :meth:`MPICluster.start`."""
    import torch                                       # the notebook has it already: its classes subclass it
    from ipyparallel.serialize import canning

    if getattr(canning, "_ddlcourse_by_value", False):
        return
    default = canning.can_map.get(type, canning.can_class)

    def can_class(obj):
        if getattr(obj, "__module__", None) == "__main__" and isinstance(obj, type) \
                and issubclass(obj, (torch.nn.Module, torch.autograd.Function)):
            return CannedByValue(obj)
        return default(obj)

    canning.can_map[type] = can_class
    canning.can_map[type(torch.autograd.Function)] = can_class
    canning._ddlcourse_by_value = True


def start(n: int | None = None, **kwargs) -> MPICluster:
    """Start an :class:`MPICluster` and return it; call ``.stop()`` when done."""
    return MPICluster(n=n, **kwargs).start()
