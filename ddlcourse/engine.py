"""The course's ipyparallel engine: ``python -m ddlcourse.engine`` is ``python -m ipyparallel.engine``, except
that it imports torch in a background thread while the engine starts up and registers with the hub.

Registration is mostly waiting (for the hub's heartbeats), and the first call on the engines needs torch
anyway: ``MPICluster.start`` describes every rank right after registration, and that first call used to
spend most of its time importing torch. Importing it during the wait takes that time out of the start;
``env/bench_cluster.py --engine ipyparallel.engine ddlcourse.engine`` measures both, interleaved.

On one host ``MPICluster`` launches the engines together with the controller, not after it: each engine
waits here for the controller's connection file (in the cluster's profile folder) while it imports, and a
file only counts once it parses, so a half-written one is never read. With ``$IPP_CONNECTION_INFO`` set
(engines on other hosts get the connection that way) there is nothing to wait for.

Only torch is preloaded, not the course's modules: they may initialise MPI (mpi4py), which belongs to the
engine's main thread (``--mpi``), and torch imports nothing the engine's own start-up imports back.
"""
from __future__ import annotations

import importlib
import json
import os
import threading
import time
from pathlib import Path

PRELOAD = ("torch",)
CONNECTION_WAIT_S = 60.0   # then ipengine's own wait says the file never came


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


def main() -> None:
    from ipyparallel.engine.app import main as engine_main

    # Started once ipyparallel is imported and before the engine connects, initialises MPI and registers: from
    # there on the engine's main thread mostly waits. (Started before ipyparallel's import it was no faster.)
    threading.Thread(target=_preload, name="ddlcourse-preload", daemon=True).start()
    path = connection_file()
    if path is not None:
        wait_for_connection_file(path)
    engine_main()


if __name__ == "__main__":
    main()
