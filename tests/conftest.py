"""Test-suite plumbing shared by the unit tests and nbval.

* Every cluster started during the run is recorded in $DDLCOURSE_RUNTIME_DIR (set by env/run_tests.sh).
  nbval kills kernels, so a notebook whose stop cell never ran can leave a cluster behind; the
  session-end hook stops whatever is recorded there, on the xdist controller only.
* After that, any ipengine/ipcontroller/mpiexec process that carries this run's tag
  (DDLCOURSE_TEST_RUN) is a leak: it is killed and the session fails.
"""
from __future__ import annotations

import os
import time

import pytest

from helpers import ROOT, run_mpi


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


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture
def mpi():
    """``run_mpi`` (tests/helpers.py), for a one-line script; a longer one is a module of tests/ranks/."""
    return run_mpi
