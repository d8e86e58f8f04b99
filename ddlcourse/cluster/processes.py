"""The processes a cluster leaves behind, and how to stop them from any state.

Every :class:`ddlcourse.cluster.MPICluster` records what it started (controller, launcher process groups,
engines and their hosts, the Slurm steps) in a JSON file under :func:`runtime_dir`. From that record
:func:`stop_all` (``python -m ddlcourse stop-all``) and the watchdog (``ddlcourse.cluster.watchdog``) stop a cluster
whose kernel died, and :func:`find_processes` lists engines and launchers that nothing records any more.
Only processes of this host are signalled by PID; engines on other nodes end with their launcher or with
``scancel`` of their Slurm steps.

Imports nothing heavier than the standard library: the watchdog runs it in a process of its own.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

ENGINE_NAMES = ("ipengine", "ipcontroller", "ipyparallel.engine", "ddlcourse.cluster.engine", "ipyparallel.controller",
                "hydra_pmi_proxy", "mpiexec", "forkserver.py")   # forked engines show their server's command


def runtime_dir() -> Path:
    """Where running clusters are recorded (``$DDLCOURSE_RUNTIME_DIR`` or ``~/.cache/ddlcourse/clusters``)."""
    d = os.environ.get("DDLCOURSE_RUNTIME_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ddlcourse", "clusters")
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p


# --------------------------------------------------------------------------- process bookkeeping
def alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie counts as gone)."""
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


def this_host() -> str:
    return socket.gethostname()


def split_engines(state: dict) -> tuple[list[int], list[tuple[str, int]]]:
    """``(pids of engines on this host, [(host, pid)] of engines on other hosts)`` from a state file."""
    pids = [p for p in state.get("engine_pids", []) or []]
    hosts = state.get("engine_hosts")
    if not isinstance(hosts, list) or len(hosts) != len(pids):  # a record without hosts: one host, the recorder's
        hosts = [state.get("host") or this_host()] * len(pids)
    here = this_host()
    return ([p for p, h in zip(pids, hosts) if p and h == here],
            [(h, p) for p, h in zip(pids, hosts) if p and h != here])


def slurm_steps(job: str) -> dict[str, str]:
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


def cancel_steps(state: dict) -> list[str]:
    """``scancel`` the Slurm steps that launched the engines, where they still run; returns those cancelled.

    Engines on other nodes are not this host's processes: Slurm stops them, on every node of the step.
    """
    job, steps = state.get("slurm_job"), state.get("slurm_steps") or []
    running = slurm_steps(job) if steps else {}
    ours = [s for s in steps if s in running]
    if ours and shutil.which("scancel"):
        try:
            subprocess.run(["scancel", "--quiet", *ours], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        deadline = time.time() + 15
        while time.time() < deadline and set(ours) & set(slurm_steps(job)):
            time.sleep(0.2)
    return ours


def kill_recorded(state: dict, grace: float = 2.0) -> bool:
    """Terminate everything a state file records: engines, launcher process groups, controller.

    Only processes of this host are signalled by PID; a PID recorded on another node names some other
    process here. Engines elsewhere end with their launcher (``srun`` forwards the signal to every task,
    ``mpiexec`` to its proxies) and, if it is gone or they outlive it, with ``scancel`` of the Slurm steps
    the cluster started. Returns False when the record belongs to another host and nothing could be done
    from here (no Slurm step to cancel): the caller should leave it for a run on that host.
    """
    here = this_host()
    recorded_on = state.get("host") or here
    if recorded_on != here:
        # launcher, controller and "local" engines all live on the host that wrote the record
        cancelled = cancel_steps(state)
        return bool(cancelled)
    pids, _ = split_engines(state)  # engines elsewhere: through their launcher, or scancel below
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
        while time.time() < deadline and any(alive(p) for p in pids + groups):
            time.sleep(0.05)
        if not any(alive(p) for p in pids + groups):
            break
    cancel_steps(state)  # remote engines whose launcher could not take them down
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
    here = this_host()
    for f, state in recorded_clusters(directory):
        foreign = (state.get("host") or here) != here   # a shared home: recorded on another node
        if only_orphans and (foreign or state.get("parent_pid") and alive(state["parent_pid"])):
            continue  # whether a process of another host is alive cannot be told from here
        if not kill_recorded(state):
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
