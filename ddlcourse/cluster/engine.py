"""The course's ipyparallel engine: ``python -m ddlcourse.cluster.engine`` is ``python -m ipyparallel.engine``, except
that it imports torch in a background thread while the engine starts up and registers with the hub.

Registration is mostly waiting (for the hub's heartbeats), and the first call on the engines needs torch
anyway: ``MPICluster.start`` describes every rank right after registration, and that first call used to
spend most of its time importing torch. Importing it during the wait takes that time out of the start;
``env/bench_cluster.py --engine ipyparallel.engine ddlcourse.cluster.engine`` measures both, interleaved.

On one host ``MPICluster`` launches the engines together with the controller, not after it: each engine
waits here for the controller's connection file (in the cluster's profile folder) while it imports, and a
file only counts once it parses, so a half-written one is never read. With ``$IPP_CONNECTION_INFO`` set
(engines on other hosts get the connection that way) there is nothing to wait for.

Only torch is preloaded, not the course's modules: they may initialise MPI (mpi4py), which belongs to the
engine's main thread (``--mpi``), and torch imports nothing the engine's own start-up imports back.

Each engine starts a nanny once it has registered (ipyparallel's, which tells the hub at once when its engine
dies), and waits for it. ipyparallel starts it as a fresh ``python``: 0.7 CPU-s of imports, on the start's
path. An engine forked by ``MPICluster``'s fork server (``$DDLCOURSE_NANNY_SERVER`` names the server) has it
forked by the same server, which has imported all the nanny needs (``python -m ddlcourse.cluster.engine --nanny``).
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddlcourse.cluster import forkserver

PRELOAD = ("torch",)
CONNECTION_WAIT_S = 60.0   # then ipengine's own wait says the file never came
NANNY_SERVER_VAR = "DDLCOURSE_NANNY_SERVER"   # the fork server that forks this engine's nanny


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- the first call that needs it imports it again and raises there
            return


def connection_file() -> Path | None:
    """The controller's connection file for engines, or None when the engine gets the connection otherwise."""
    if os.environ.get("IPP_CONNECTION_INFO") or not os.environ.get("IPP_PROFILE_DIR"):
        return None
    cid = os.environ.get("IPP_CLUSTER_ID", "")
    name = f"ipcontroller-{cid}-engine.json" if cid else "ipcontroller-engine.json"
    return Path(os.environ["IPP_PROFILE_DIR"]) / "security" / name


def wait_for_connection_file(path: Path, timeout: float = CONNECTION_WAIT_S) -> bool:
    """Until ``path`` holds a whole JSON document (the controller writes it while we start)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            json.loads(path.read_text())
            return True
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def start_forked_nanny(server: str, **kwargs):
    """ipyparallel's ``start_nanny`` (same protocol: its arguments pickled on the nanny's stdin, its URL back on
    its stdout, which the engine keeps open), with the nanny forked by the fork server at ``server``."""
    kwargs["pid"] = os.getpid()
    env = {k: v for k, v in os.environ.items() if k != "PMI_FD"}  # the engine's PMI socket is not the nanny's
    env["PYTHONUNBUFFERED"] = "1"
    p = subprocess.Popen(forkserver.rank_command(server, ["-m", "ddlcourse.cluster.engine", "--nanny"]), env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    p.stdin.write(pickle.dumps(kwargs))
    p.stdin.close()
    url = p.stdout.readline().decode("utf8").strip()
    if not url:
        p.terminate()
        raise RuntimeError("nanny failed")
    return url, p


def nanny_main() -> None:
    """The nanny, as ``python -m ipyparallel.engine.nanny``. Forked from a server that imported torch, it leaves
    with ``os._exit``: the interpreter's teardown would copy the pages it shares with the server, and the stop
    waits for the nanny (a 2-engine stop took 1.33 s with that teardown, 0.88-0.96 s without, medians of 3,
    env/bench_cluster.py). It never touches MPI, and ``KernelNanny.main`` has ended its ZMQ context."""
    from ipyparallel.engine.nanny import main as run_nanny

    run_nanny()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    if sys.argv[1:] == ["--nanny"]:
        return nanny_main()
    from ipyparallel.engine import app

    server = os.environ.get(NANNY_SERVER_VAR)
    if server:
        app.start_nanny = lambda **kwargs: start_forked_nanny(server, **kwargs)
    # Started once ipyparallel is imported and before the engine connects, initialises MPI and registers: from
    # there on the engine's main thread mostly waits. (Started before ipyparallel's import it was no faster.)
    threading.Thread(target=_preload, name="ddlcourse-preload", daemon=True).start()
    path = connection_file()
    if path is not None:
        wait_for_connection_file(path)
    app.main()


if __name__ == "__main__":
    main()
