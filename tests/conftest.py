"""Test-suite plumbing shared by the unit tests and nbval.

* Every cluster started during the run is recorded in $DDLCOURSE_RUNTIME_DIR (set by env/run_tests.sh).
  nbval kills kernels, so a notebook whose stop cell never ran can leave a cluster behind; the
  session-end hook stops whatever is recorded there, on the xdist controller only.
* After that, any ipengine/ipcontroller/mpiexec process that carries this run's tag
  (DDLCOURSE_TEST_RUN) is a leak: it is killed and the session fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    os.environ.setdefault("DDLCOURSE_TEST_RUN", f"pytest-{os.getpid()}")
    os.environ.setdefault("DDLCOURSE_RUNTIME_DIR", str(ROOT / ".test-runtime" / os.environ["DDLCOURSE_TEST_RUN"]))
    os.environ.setdefault("DDLCOURSE_SCALE", "smoke")
    os.environ.setdefault("MPLBACKEND", "Agg")


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session, exitstatus):
    from ddlcourse.cluster import forkserver

    forkserver.stop_shared()   # run_mpi's and the clusters' engines' fork servers, before the search for strays
    if _is_xdist_worker(session.config):
        return
    from ddlcourse import cluster

    stopped = cluster.stop_all(os.environ["DDLCOURSE_RUNTIME_DIR"])
    if stopped:
        print(f"\n[conftest] stopped {stopped} cluster(s) left by killed kernels")
    marker = os.environ["DDLCOURSE_TEST_RUN"]
    deadline = time.time() + 10  # watchdogs may still be finishing their cleanup
    leaks = cluster.find_processes(marker=marker)
    while leaks and time.time() < deadline:
        time.sleep(0.5)
        leaks = cluster.find_processes(marker=marker)
    if leaks:
        print("\n[conftest] ERROR: stray processes left by the test run:")
        for pid, cmd in leaks:
            print(f"  {pid}: {cmd[:160]}")
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ----------------------------------------------------------------------------- helpers for tests
def _forkserver_socket() -> str | None:
    """This process's rank fork server (ddlcourse/cluster/forkserver.py), started on first use; None if it will not.

    DDLCOURSE_TEST_FORKSERVER=0 turns it off: every rank is then a fresh ``python -c``."""
    import tempfile

    from ddlcourse.cluster import forkserver

    if os.environ.get("DDLCOURSE_TEST_FORKSERVER", "1") == "0":
        return None
    env = dict(os.environ, OMP_NUM_THREADS="1")   # run_mpi's ranks get -genv OMP_NUM_THREADS 1
    env.pop("PYTHONUNBUFFERED", None)
    return forkserver.shared(forkserver.PRELOAD, env, tempfile.gettempdir(), wait=120)


def run_mpi(n: int, code: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -c code`` on ``n`` ranks with the venv's mpiexec; raise with output on failure.

    Each rank is forked from this worker's fork server, which has imported torch once (ddlcourse/cluster/forkserver.py
    says what it keeps and what it refuses); without one, it is a fresh ``python -c code``."""
    from ddlcourse.cluster import forkserver
    from ddlcourse.cluster import find_mpiexec

    sock = _forkserver_socket()
    rank = [sys.executable, "-c", code] if sock is None else forkserver.rank_command(sock, ["-c", code])
    cmd = [find_mpiexec(), "-n", str(n), "-bind-to", "none", "-genv", "OMP_NUM_THREADS", "1", *rank]
    full_env = dict(os.environ, **(env or {}))
    if "PYTHONUNBUFFERED" not in (env or {}):
        # Unbuffered, print() writes its arguments one by one and the ranks' words interleave in mpiexec's
        # stdout ("RESUMEDRESUMED 4 ..."); block-buffered, each rank's output leaves in whole writes.
        full_env.pop("PYTHONUNBUFFERED", None)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
    if p.returncode != 0:
        raise AssertionError(f"mpiexec -n {n} failed ({p.returncode}):\nSTDOUT:\n{p.stdout[-4000:]}\nSTDERR:\n{p.stderr[-4000:]}")
    return p


@pytest.fixture
def mpi():
    return run_mpi


# The exercise checkers on real ranks (tests/test_exercises_nbNN.py): what every such script starts with ...
_RANKS_PRELUDE = """
from mpi4py import MPI
from ddlcourse.selfcheck import run_checker
RANK = MPI.COMM_WORLD.Get_rank()
def reject(name, wrong, hint):
    \"\"\"Every rank rejects ``wrong``, with a message that names the mistake.\"\"\"
    v = run_checker(name, wrong)
    assert not v.ok and hint in v.message, (RANK, hint, v.message)
def reject_somewhere(name, wrong, hint):
    \"\"\"A mistake may leave some ranks right (the last stage's gradient is right whatever the others do): it
    must be caught on at least one rank, and named on every rank that catches it.\"\"\"
    v = run_checker(name, wrong)
    vs = MPI.COMM_WORLD.allgather((v.ok, v.message))
    assert not all(ok for ok, _ in vs) and all(ok or hint in msg for ok, msg in vs), (hint, vs)
"""
# ... and ends with: one line from rank 0 once every rank got there, then the process group torn down.
_RANKS_FOOTER = """
oks = MPI.COMM_WORLD.gather(RANK)
if RANK == 0:
    print("checked on ranks", sorted(oks))
import sys
if "ddlcourse.dist" in sys.modules:
    sys.modules["ddlcourse.dist"].shutdown()
"""


def check_on_ranks(n: int, body: str, **kwargs) -> subprocess.CompletedProcess:
    """Run an exercise check ``body`` on ``n`` ranks; it passes only if every rank ran it to the end.

    ``body`` may use ``run_checker``, ``reject``, ``reject_somewhere``, ``MPI`` and ``RANK``."""
    p = run_mpi(n, _RANKS_PRELUDE + textwrap.dedent(body) + _RANKS_FOOTER, **kwargs)
    assert f"checked on ranks {list(range(n))}" in p.stdout, p.stdout
    return p


@pytest.fixture
def on_ranks():
    return check_on_ranks
