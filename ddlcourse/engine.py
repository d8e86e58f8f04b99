"""The course's ipyparallel engine: ``python -m ddlcourse.engine`` is ``python -m ipyparallel.engine``, except
that it imports torch in a background thread while the engine starts up and registers with the hub.

Registration is mostly waiting (for the hub's heartbeats), and the first call on the engines needs torch
anyway: ``MPICluster.start`` describes every rank right after registration, and that first call used to
spend most of its time importing torch. Importing it during the wait takes that time out of the start;
``env/bench_cluster.py --engine ipyparallel.engine ddlcourse.engine`` measures both, interleaved.

Only torch is preloaded, not the course's modules: they may initialise MPI (mpi4py), which belongs to the
engine's main thread (``--mpi``), and torch imports nothing the engine's own start-up imports back.
"""
from __future__ import annotations

import importlib
import threading

PRELOAD = ("torch",)


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- the first call that needs it imports it again and raises there
            return


def main() -> None:
    from ipyparallel.engine.app import main as engine_main

    # Started once ipyparallel is imported and before the engine connects, initialises MPI and registers: from
    # there on the engine's main thread mostly waits. (Started before ipyparallel's import it was no faster.)
    threading.Thread(target=_preload, name="ddlcourse-preload", daemon=True).start()
    engine_main()


if __name__ == "__main__":
    main()
