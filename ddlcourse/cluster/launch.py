"""How to launch N MPI ranks here: the ``mpiexec`` or ``srun`` command line, and what the allocation allows.

:class:`ddlcourse.cluster.MPICluster` starts its engines with :func:`launch_command`; so does any other MPI job
the course starts from a notebook's kernel (:func:`ddlcourse.profiling.run_horovod_timeline`). The Slurm
templates ask :func:`srun_mpi_plugin` (through ``python -m ddlcourse srun-mpi``) which ``srun --mpi``
plugin starts ranks of mpi4py's MPI as one world.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import psutil


class ClusterError(RuntimeError):
    """A cluster could not be started or used."""


# Launches of pip's MPICH under ``srun --mpi=pmi2`` break at start-up now and then, and not through any fault
# of the job: Slurm's pmi2 plugin reads a PMI-1 request with a single read() of 1024 bytes
# (src/plugins/mpi/pmi2/pmi1.c, "TODO: read until newline"), and MPICH puts its address table at MPI_Init in
# pieces of up to 1024 characters plus the command, which run over whenever their bytes compress badly. Then
# slurmstepd logs these lines, and MPI_Init aborts or the ranks wait on the PMI fence. Starting again works
# (tests/test_slurm.py::test_long_pmi1_requests_are_cut shows the limit; env/slurm/README.md explains it).
PMI_CUT_SIGNS = ("mpi/pmi2: invalid client request", "mpi/pmi2: value not properly terminated")
PMI_START_ATTEMPTS = 3   # launches in all while start-up breaks this way (MPICluster.start, run_job, the tests' jobs)
PMI_CUT_GRACE = 20.0     # seconds a launch may go on after the signs of a cut PMI request (then: start again)


def pmi_cut(text: str) -> bool:
    """The output of a launch shows MPI's start-up under ``srun --mpi=pmi2`` breaking (see PMI_CUT_SIGNS)."""
    return ("MPI_Init_thread" in text and "failed" in text) or any(sign in text for sign in PMI_CUT_SIGNS)


def pmi_retry_note(attempt: int) -> str:
    """What a retried launch says, so that a slow start is explained."""
    return (f"MPI start-up broke inside Slurm's PMI (a request cut at 1024 bytes; see env/slurm/README.md), "
            f"attempt {attempt} of {PMI_START_ATTEMPTS}")


# --------------------------------------------------------------------------- the allocation
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


# --------------------------------------------------------------------------- the command line
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


# --------------------------------------------------------------------------------- srun's PMI plugin
def mpi_library_version() -> str:
    """``MPI_Get_library_version`` of the MPI mpi4py was built with.

    When this process has not imported ``mpi4py.MPI`` yet, a child Python asks (with MPI initialisation
    turned off there), so that this process keeps mpi4py's normal start-up for later.
    """
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"].Get_library_version().strip()
    code = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
            "from mpi4py import MPI; print(MPI.Get_library_version())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"could not ask mpi4py for its MPI library: {p.stderr.strip()[-300:]}")
    return p.stdout.strip()


def pmi_plugin_for(library_version: str) -> tuple[str, str]:
    """``(plugin, why)``: the ``srun --mpi`` plugin that starts ranks of this MPI as one world."""
    v = library_version.lower()
    first = " ".join(library_version.strip().splitlines()[0].split()) if library_version.strip() else "(empty)"
    if "cray mpich" in v:
        return "cray_shasta", f"Cray MPICH ({first}) uses Slurm's cray_shasta plugin"
    if "open mpi" in v:
        return "pmix", f"Open MPI ({first}) is started through PMIx"
    if "intel(r) mpi" in v or "intel mpi" in v:
        return "pmi2", f"Intel MPI ({first}) speaks PMI-2 (set I_MPI_PMI_LIBRARY to Slurm's libpmi2.so)"
    if "mvapich" in v:
        return "pmi2", f"MVAPICH ({first}) speaks PMI-2"
    if "mpich" in v:
        return "pmi2", f"MPICH ({first}) speaks PMI-2 (the course venv's mpich wheel)"
    return "pmi2", f"unknown MPI ({first}): guessing pmi2; set DDLCOURSE_SRUN_MPI (see `srun --mpi=list`)"


def srun_mpi_plugin(library_version: str | None = None) -> tuple[str, str]:
    """``(plugin, why)``: ``$DDLCOURSE_SRUN_MPI`` when set, else detected from mpi4py's MPI library."""
    override = os.environ.get("DDLCOURSE_SRUN_MPI", "").strip()
    if override:
        return override, "set by DDLCOURSE_SRUN_MPI"
    return pmi_plugin_for(library_version if library_version is not None else mpi_library_version())


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
            _SRUN_MPI["plugin"] = srun_mpi_plugin()[0]
        except Exception as e:  # no mpi4py here: leave the choice to the site's MpiDefault
            warnings.warn(f"could not tell which srun --mpi plugin mpi4py needs ({e}); using the site's "
                          "default. Set DDLCOURSE_SRUN_MPI (see env/slurm/README.md).", stacklevel=3)
            _SRUN_MPI["plugin"] = None
    return _SRUN_MPI["plugin"]


# --------------------------------------------------------------------------- the launcher, once started
def launcher_ended(engine_set) -> bool:
    """The launcher (mpiexec/srun) of an ipyparallel engine set has exited. Asked of the process itself: the
    engine set notices an exit only while its event loop runs, which between the cluster's calls it does not."""
    proc = getattr(engine_set, "process", None)   # a psutil.Process (ipyparallel's local launchers)
    if not engine_set.running:
        return True
    if proc is None:
        return False
    try:   # an exited child nobody has reaped yet is a zombie
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def launcher_exit(engine_set, wait: float = 2.0) -> str:
    """How an ended launcher ended, in words: ``"exited with code 1"``, ``"was killed by SIGKILL"``, or
    ``"exited"`` when it cannot be told. psutil keeps the status once ipyparallel's wait thread reaped it."""
    proc = getattr(engine_set, "process", None)
    try:
        code = proc.wait(timeout=wait) if proc is not None else None
    except (psutil.Error, ChildProcessError, OSError):
        code = None
    if code is None:
        code = (getattr(engine_set, "stop_data", None) or {}).get("exit_code")
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --------------------------------------------------------------------------- a job started from a kernel
def run_job(cmd: list[str], env: dict | None = None, timeout: float = 240.0, what: str = "the MPI job",
            cut_grace: float = PMI_CUT_GRACE) -> subprocess.CompletedProcess:
    """Run an MPI job's launcher (``srun ...`` or ``mpiexec ...``, from :func:`launch_command`) to its end and
    return it, its stdout and stderr together in ``.stdout``.

    A launch whose start-up broke in Slurm's PMI (:func:`pmi_cut`) is started again, each retry said on stderr,
    up to PMI_START_ATTEMPTS launches in all: when it exits with the signs, and when it still runs ``cut_grace``
    seconds after them (its ranks then wait on the PMI fence for ever). A job still running after ``timeout``
    seconds in all is ended, and ``TimeoutError`` gives its output so far. Ending a job: SIGTERM to the
    launcher (srun then ends the step on every node), SIGKILL to its process group 10 s later; the same happens
    when the caller is interrupted (a notebook's stop button), so no rank is left behind.
    """
    import threading
    import time

    deadline = time.monotonic() + timeout
    for attempt in range(1, PMI_START_ATTEMPTS + 1):
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        cut_at = None
        try:
            while proc.poll() is None:
                now = time.monotonic()
                cut_at = cut_at or (now if pmi_cut("".join(lines)) else None)
                if now > deadline or (cut_at and now - cut_at > cut_grace):
                    break
                time.sleep(0.1)
        finally:
            running = proc.poll() is None
            if running:
                _end_job(proc)
            reader.join(timeout=5)
        out, now = "".join(lines), time.monotonic()
        cut = pmi_cut(out)
        if not running and (proc.returncode == 0 or not cut):
            return subprocess.CompletedProcess(cmd, proc.returncode, out, "")
        if cut and attempt < PMI_START_ATTEMPTS and now < deadline:
            print(f"[launch] {what}: {pmi_retry_note(attempt)}: starting it again", file=sys.stderr, flush=True)
            continue
        if running:
            why = (f"still ran {cut_grace:.0f} s after its MPI start-up broke inside Slurm's PMI" if now < deadline
                   else f"did not finish in {timeout:.0f} s")
            raise TimeoutError(f"{what} {why}, and was ended. Its output:\n{out[-3000:]}")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, "")   # it failed: its output says why
    raise AssertionError("unreachable")


def _end_job(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End a launcher started in its own session: SIGTERM to it, then SIGKILL to its whole process group."""
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # its local children too (mpiexec's proxies and ranks)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
