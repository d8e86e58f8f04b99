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
* a quick start on one host: the engines are forked from a server that has imported torch once
  (:func:`ddlcourse.cluster.forkserver.shared`), which the process's first cluster starts and its later clusters
  reuse; it ends when the process does, killed or not;
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

How the ranks are launched lives in :mod:`ddlcourse.cluster.launch`; the record of what a cluster started, and the
clean-up from it, in :mod:`ddlcourse.cluster.processes`; where a rank runs, in :mod:`ddlcourse.cluster.placement`.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import ipyparallel as ipp
from ipyparallel.error import EngineError
from IPython import get_ipython

from ddlcourse.cluster import forkserver, placement
from ddlcourse.cluster.canning import send_notebook_classes_by_value
from ddlcourse.cluster.engine import NANNY_SERVER_VAR
from ddlcourse.cluster.launch import (PMI_CUT_GRACE, PMI_START_ATTEMPTS, ClusterError, allocation_tasks,
                                     available_cores, default_n, find_mpiexec, in_slurm_allocation, launch_command,
                                     launcher_ended, launcher_exit, may_span_hosts, pmi_cut, pmi_retry_note)
from ddlcourse.cluster.processes import (kill_recorded as _kill_recorded, runtime_dir, slurm_steps as _slurm_steps,
                                         this_host as _this_host)

DEFAULT_TIMEOUT = 120.0  # seconds for all engines to register
RUN_POLL_S = 0.5         # run(): how often it looks for dead engines, calls progress and checks its timeout


class RanksTimeout(TimeoutError):
    """:meth:`MPICluster.run` ran past its ``timeout``. ``answered``: ``{rank: result}`` of the ranks that answered
    (a rank that raised holds its exception); ``pending``: the ranks still working."""

    def __init__(self, fn, seconds: float, answered: dict, n: int):
        self.answered, self.pending = answered, [r for r in range(n) if r not in answered]
        name = getattr(fn, "__name__", repr(fn))
        super().__init__(f"{name} got no answer from rank(s) {self.pending} within {seconds:g} s "
                         f"({len(answered)} of {n} answered)")


def _answered(ar) -> dict:
    """``{rank: result or exception}`` of the ranks (children of ``ar``, in rank order) that have answered."""
    out = {}
    for rank, child in enumerate(ar._children):
        if child.done():
            try:
                out[rank] = child.result()
            except Exception as e:   # noqa: BLE001 -- the rank's own error is its answer
                out[rank] = e
    return out


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
# waiting; at 0.5 s it took 3.4 s. With the fork server an engine is up in well under a beat, so the wait
# rounds up to whole beats: at 250 ms a warm start took 1.40 s against 1.77 s at 500 ms, a kernel's first
# 3.16 s against 3.46 s (2026-11-29, env/bench_cluster.py --heartbeat-ms 500 250 --engine-fork on, then cold).
# An engine counts as dead after ENGINE_DEAD_S without an answer, as after ipyparallel's 10 x 3 s.
HEARTBEAT_MS, ENGINE_DEAD_S = 250, 30
# On one host, launch the engines together with the controller rather than once it is up: they import while
# it starts (env/bench_cluster.py --engines-start with after compares both).
ENGINES_WITH_CONTROLLER = True
# The engines' program: ipyparallel's engine, with torch imported while it registers (ddlcourse.cluster.engine).
ENGINE_MODULE = "ddlcourse.cluster.engine"
# On one host, the engines are forked from a server that has imported ipyparallel's engine and what a rank's
# training imports (forkserver.PRELOAD: numpy, torch, torch._dynamo; ddlcourse.cluster.forkserver.shared). The first
# cluster of a process starts it and it serves every later one, until the process exits or dies: n engines
# share one import of about 6 CPU-seconds instead of paying it n times, and a later cluster pays none
# (env/bench_cluster.py --engine-fork on cold off compares them). One server per import-time environment
# (OMP_NUM_THREADS, the threads per rank, is read when torch loads). Across hosts (srun) each engine starts
# fresh. DDLCOURSE_ENGINE_FORK=0 turns it off.
ENGINE_FORK = os.environ.get("DDLCOURSE_ENGINE_FORK", "1") != "0"
ENGINE_PRELOAD = ("ipyparallel.engine.app", "ipyparallel.engine.kernel", *forkserver.PRELOAD)
# Each forked engine's nanny is forked by the same server (ddlcourse.cluster.engine.start_forked_nanny), not started as a
# fresh python; False starts it fresh, as ipyparallel does (env/bench_cluster.py --nanny forked fresh compares).
NANNY_FORK = True


def _phase_clock(phases: dict, t0: float):
    """``phase(name)``: records in ``phases`` the seconds since the previous call (the first: since ``t0``)."""
    mark = [t0]

    def phase(name: str) -> None:
        now = time.perf_counter()
        phases[name] = now - mark[0]
        mark[0] = now
    return phase


def _describe_engine() -> dict:  # runs on an engine
    return placement.describe()


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
        self.stop_phases: dict[str, float] = {}    # and of the last stop
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
        if self.running:
            return self
        send_notebook_classes_by_value()
        for attempt in range(1, PMI_START_ATTEMPTS + 1):
            try:
                return self._start_once()
            except ClusterError as e:
                # Slurm's pmi2 plugin cut one of MPI_Init's PMI requests (see launch.PMI_CUT_SIGNS): not the
                # notebook's fault, and a new launch works. Said, so that a slow start is explained.
                if self._launcher_kind != "srun" or not pmi_cut(str(e)) or attempt == PMI_START_ATTEMPTS:
                    raise
                print(f"[cluster] {pmi_retry_note(attempt)}: starting the engines again", file=sys.stderr, flush=True)
        raise AssertionError("unreachable")

    def restart(self) -> "MPICluster":
        """Stop the engines and start new ones, the same number in the same way: what a check does when the
        learner's code left its ranks hung or dead. What was set on the engines (``%px``) is gone."""
        quiet, self.quiet = self.quiet, True
        try:
            self.stop()
            return self.start()
        finally:
            self.quiet = quiet

    def _start_once(self) -> "MPICluster":
        launcher, mpi_cmd, mpi_args = launch_command(self.n, self.launcher, self.threads_per_rank, self.mpiexec)
        self._launcher_kind = launcher
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
                             f"--HeartMonitor.max_heartmonitor_misses={round(ENGINE_DEAD_S * 1000 / HEARTBEAT_MS)}"],
        )
        if launcher == "srun":
            mpi_args = [*mpi_args, f"--job-name={cid}"]  # the step's name: how cleanup finds it (scancel)
        self._slurm_job = os.environ.get("SLURM_JOB_ID") if in_slurm_allocation() else None
        self._steps_before = set(_slurm_steps(self._slurm_job)) if self._slurm_job else set()
        # On one host the engines start with the controller and read its connection file from the profile
        # folder once it is written (ddlcourse.cluster.engine waits for it); across hosts that folder may not be
        # shared, so ipyparallel waits for the controller and hands the engines its connection in the environment.
        self._cluster.send_engines_connection_env = multi_host or not ENGINES_WITH_CONTROLLER
        cfg = self._cluster.config
        engine_env = {"OMP_NUM_THREADS": str(self.threads_per_rank), "DDLCOURSE_THREADS": str(self.threads_per_rank)}
        cfg.MPIEngineSetLauncher.mpi_cmd = mpi_cmd
        cfg.MPIEngineSetLauncher.mpi_args = mpi_args
        cfg.MPIEngineSetLauncher.engine_cmd = [sys.executable, "-m", ENGINE_MODULE]
        cfg.MPIEngineSetLauncher.environment = engine_env
        self._state_file = runtime_dir() / f"cluster-{cid}.json"
        phases = {}
        phase = _phase_clock(phases, t0)   # seconds per start-up phase (env/bench_cluster.py)

        phase("configure")
        try:
            sock = (forkserver.shared(ENGINE_PRELOAD, dict(os.environ, **engine_env), runtime_dir(), wait=10)
                    if ENGINE_FORK and launcher == "mpiexec" and not multi_host else None)
            if sock is not None:
                cfg.MPIEngineSetLauncher.engine_cmd = forkserver.rank_command(sock, ["-m", ENGINE_MODULE])
                if NANNY_FORK:
                    cfg.MPIEngineSetLauncher.environment = dict(engine_env, **{NANNY_SERVER_VAR: sock})
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
        deadline, cut_at, stopped = time.perf_counter() + self.timeout, None, False
        while True:
            try:
                self._rc.wait_for_engines(self.n, timeout=min(1.0, max(0.01, deadline - time.perf_counter())),
                                          interactive=False)
                return
            except TimeoutError:
                pass
            except EngineError:   # ipyparallel's word for "the launcher exited": said below, with its output
                stopped = True
            got = len(self._rc.ids)
            if self._launcher_kind == "srun":   # ranks left waiting on a PMI fence after a cut request
                out = self._launcher_output()
                cut_at = cut_at or (time.perf_counter() if pmi_cut(out) else None)
                if cut_at and time.perf_counter() - cut_at > PMI_CUT_GRACE:
                    raise ClusterError(f"MPI start-up broke inside Slurm's PMI: {got} of {self.n} engines "
                                       f"registered {PMI_CUT_GRACE:.0f} s after it. Launcher output:\n{out}")
            ended = stopped or any(launcher_ended(es) for es in self._cluster.engines.values())
            if ended or time.perf_counter() >= deadline:
                how = launcher_exit(next(iter(self._cluster.engines.values()))) if ended else ""
                why = (f"the launcher ({self._launcher_kind}) {how} after {got} of {self.n} engines registered"
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
            [sys.executable, "-m", "ddlcourse.cluster.watchdog", str(os.getpid()), str(self._state_file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop engines, mpiexec and controller; safe to call twice and from any state."""
        if self._cluster is None:
            return
        t0 = time.perf_counter()
        c = self._cluster
        phases = {}
        phase = _phase_clock(phases, t0)   # seconds per phase of the stop (env/bench_cluster.py)

        try:
            asked = False
            # Only registered engines can be asked to leave. A launcher none of whose engines registered (a failed
            # start: srun hung on the PMI fence, a launcher that never started one) would not exit on its own:
            # waiting for it only delayed the stop by the wait below, so it is stopped with the cluster at once.
            if self._rc is not None and any(es.running for es in c.engines.values()):
                try:  # not block=True: an engine that died but is still registered never answers
                    if self._rc.ids:
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
            phase("engines exited")
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
            phase("controller stopped")
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
            phase("cleaned up")
            self.stop_phases = phases
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

    def run(self, fn, *args, progress=None, timeout: float | None = None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        The one way the course runs a function on the engines (``training.run``, ``selfcheck.check_code`` and the
        notebooks' ``c.run(dist.on_first_ranks, k, fn, ...)`` all come through here). While the ranks work it
        watches them: a dead engine is a :class:`ClusterError` within a second or so, not a hang.

        ``progress``: called with no argument about every ``RUN_POLL_S`` while the ranks work (``training.run``
        draws its bar with it). ``timeout``: seconds; after it, :class:`RanksTimeout`, which holds the results of
        the ranks that did answer (the others are still busy: a rank waiting for a message never ends by itself).
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
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return ar.get(timeout=RUN_POLL_S)
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
            if progress is not None:
                progress()
            if deadline is not None and time.monotonic() >= deadline:
                raise RanksTimeout(fn, timeout, _answered(ar), self.n)

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
        how = f"; the launcher ({self._launcher_kind}) {launcher_exit(ended[0])}" if ended else ""
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


def start(n: int | None = None, **kwargs) -> MPICluster:
    """Start an :class:`MPICluster` and return it; call ``.stop()`` when done."""
    return MPICluster(n=n, **kwargs).start()
