"""Two Slurm nodes on this machine, from Python: the pytest fixture of tests/test_multinode.py uses this.

    from harness import TwoNodes            # env/multinode/ on sys.path
    nodes = TwoNodes(state_dir)
    reason = nodes.unavailable()           # None, or why two nodes cannot be built here (not root, no netns...)
    nodes.up()                             # env/multinode/two_nodes.sh up
    p = nodes.run(1, ["srun", "-N2", "-n4", "hostname"])
    nodes.down()                           # also registered with atexit and for SIGTERM/SIGHUP by guard()

The shell script does the work (an instructor runs the same script by hand, see env/slurm/README.md);
this module adds what a test needs: commands on a node with a clean environment, the processes living in
each node (by network namespace, ``ip netns pids``), and a teardown that runs however the test ends.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "env" / "multinode" / "two_nodes.sh"
NODES = {1: ("ddlnode1", "192.0.2.1"), 2: ("ddlnode2", "192.0.2.2")}
TOOLS = ("ip", "unshare", "nsenter", "mount")
SLURM_TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "salloc", "srun", "squeue", "scancel")


def _apt_install(packages: list[str]) -> str | None:
    """Install Debian packages (root only); None on success, else why not. Waits for a held dpkg lock."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"{' '.join(packages)} missing, and this is not a root Debian machine to apt-get them on"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=600"]  # another test may be installing the same packages right now
    try:
        for cmd in (["apt-get", *lock, "update", "-qq"], ["apt-get", *lock, "install", "-y", "-q", *packages]):
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if p.returncode != 0:
                return f"{' '.join(cmd)} failed: {p.stderr.strip()[-400:]}"
    except subprocess.TimeoutExpired:
        return f"apt-get install {' '.join(packages)} took more than 15 minutes"
    return None


def clean_env(**extra) -> dict:
    """This environment without Slurm job variables (pytest may itself run inside a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env.update(extra)
    return env


class TwoNodes:
    def __init__(self, state_dir: Path | str):
        self.dir = Path(state_dir)
        self.owner = os.getpid()
        self._is_up = False
        self._guarded = False

    # ------------------------------------------------------------------ can it be built here?
    def unavailable(self, install: bool = True) -> str | None:
        """None when two nodes can be built here (installing slurm-wlm/munge if needed), else the reason."""
        if sys.platform != "linux":
            return "network namespaces are Linux only"
        if os.geteuid() != 0:
            return "not root: network namespaces and slurmd need root"
        missing = [t for t in TOOLS if not shutil.which(t)]
        if missing:
            return f"missing {', '.join(missing)} (iproute2, util-linux)"
        if not all(shutil.which(t) for t in SLURM_TOOLS):
            why = _apt_install(["slurm-wlm", "munge"]) if install else "slurm-wlm/munge are not installed"
            if why:
                return why
            if not all(shutil.which(t) for t in SLURM_TOOLS):
                return "apt-get ran, but slurmctld/slurmd/munged are still missing"
        probe = f"ddlmn-{self.owner}-0"   # can this machine (container) make a namespace at all?
        p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        if p.returncode != 0:
            return f"cannot create a network namespace: {p.stderr.strip()}"
        p = subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True, text=True)
        if p.returncode != 0:
            return f"cannot create UTS/mount namespaces: {p.stderr.strip()}"
        return None

    # ------------------------------------------------------------------ life cycle
    def _script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = clean_env(DDLCOURSE_MN_OWNER=str(self.owner))
        # its own session: a TERM sent to our process group (CI's limit, a killed make) does not cut it short
        return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env,
                              timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)

    def up(self) -> float:
        """Build the nodes and start Slurm; returns the seconds it took. Raises with the logs on failure."""
        self._script("clean-stale")   # namespaces left by a run that was killed (its owner is gone)
        t0 = time.perf_counter()
        self._is_up = True            # from here on, down() has something to undo
        p = self._script("up", str(self.dir))
        if p.returncode != 0:
            raise RuntimeError(f"two_nodes.sh up failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return time.perf_counter() - t0

    def down(self) -> None:
        """Stop every daemon and process on both nodes and delete the namespaces. Safe to call twice."""
        if not self._is_up:
            return
        self._is_up = False
        with _signals_held():     # a TERM now must not abort the teardown half-way (it comes after)
            p = self._script("down", str(self.dir))
        if p.returncode != 0:
            print(f"[multinode] two_nodes.sh down: {p.stdout}\n{p.stderr}", file=sys.stderr)

    def guard(self) -> None:
        """Tear down at interpreter exit and on SIGTERM/SIGHUP too (pytest's own finalizers miss those)."""
        if self._guarded:
            return
        self._guarded = True
        atexit.register(self.down)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                previous = signal.getsignal(sig)

                def handler(signum, frame, previous=previous):
                    self.down()
                    if callable(previous):
                        previous(signum, frame)
                    else:
                        signal.signal(signum, signal.SIG_DFL)
                        os.kill(os.getpid(), signum)

                signal.signal(sig, handler)
            except ValueError:  # not the main thread: atexit and the fixture's finally remain
                pass

    # ------------------------------------------------------------------ using the nodes
    @property
    def slurm_conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self, **extra) -> dict:
        return clean_env(SLURM_CONF=str(self.slurm_conf), **extra)

    def command(self, node: int, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` on ``node`` (1 or 2), as that host, with the same PID."""
        return ["bash", str(SCRIPT), "exec", str(self.dir), str(node), *argv]

    def run(self, node: int, argv: list[str], env: dict | None = None, timeout: float = 300,
            **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(node, argv), capture_output=True, text=True, cwd=ROOT,
                              env=env if env is not None else self.env(), timeout=timeout, **kwargs)

    def popen(self, node: int, argv: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(node, argv), cwd=ROOT, env=env if env is not None else self.env(),
                                text=True, **kwargs)

    def namespace(self, node: int) -> str:
        return (self.dir / f"ns{node}").read_text().strip()

    def pids(self, node: int) -> list[int]:
        """Every process living in the node (its network namespace)."""
        p = subprocess.run(["ip", "netns", "pids", self.namespace(node)], capture_output=True, text=True)
        return [int(x) for x in p.stdout.split()]

    def daemon_pids(self) -> set[int]:
        """munged, slurmctld (and its slurmscriptd child) and both slurmds."""
        pids = set()
        for f in (self.dir / "run").glob("*.pid"):
            try:
                pids.add(int(f.read_text().strip()))
            except (OSError, ValueError):
                continue
        for pid in list(pids):  # slurmctld forks slurmscriptd
            pids.update(c for c in children(pid) if "slurmscriptd" in (_cmdline(c) or ""))
        return pids

    def strays(self, node: int, allowed: set[int] = frozenset()) -> list[tuple[int, str]]:
        """Processes in the node that are neither a Slurm daemon nor in ``allowed``."""
        keep = self.daemon_pids() | set(allowed)
        return [(p, _cmdline(p)) for p in self.pids(node) if p not in keep and _running(p)]

    def wait_clean(self, node: int, allowed: set[int] = frozenset(), timeout: float = 20) -> list[tuple[int, str]]:
        """Wait until the node holds only the daemons (and ``allowed``); returns what is left at the end.

        A slurmstepd needs a moment to exit after its step ended, so a short wait is not a leak.
        """
        deadline = time.time() + timeout
        left = self.strays(node, allowed)
        while left and time.time() < deadline:
            time.sleep(0.3)
            left = self.strays(node, allowed)
        return left

    def logs(self, lines: int = 30) -> str:
        out = []
        for f in sorted((self.dir / "log").glob("*.log")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(out)


@contextlib.contextmanager
def _signals_held(signals=(signal.SIGTERM, signal.SIGHUP, signal.SIGINT)):
    """Hold these signals for the block, then deliver each one that came to the handler of before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, frame: came.append(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(came):
            os.kill(os.getpid(), sig)


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child its parent has not reaped yet is no leak)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []
