"""One simulated rank of a rehearsal: a real process that runs the checker and the learner's code, whose MPI and
``torch.distributed`` calls go to the referee (:mod:`ddlcourse.exercises.referee`) instead of a network.

Started by :mod:`ddlcourse.exercises.rehearsal` as ``python -m ddlcourse.exercises.simranks ADDRESS KEY RANK``
(forked from the course's fork server). Before anything imports MPI it puts a module of its own in the place of
``mpi4py.MPI`` and replaces the communication calls of ``torch.distributed``; the rank computes on the CPU. Each call
says whether the learner's code made it (a frame of the learner's files is on the stack) and from which line.

Its parts: :mod:`~ddlcourse.exercises.simworld` (the line to the referee), :mod:`~ddlcourse.exercises.simmpi` (the
stand-in for ``mpi4py.MPI``) and :mod:`~ddlcourse.exercises.simtorch` (``torch.distributed`` and DDP).
"""
from __future__ import annotations

import os
import pickle
import sys
from multiprocessing.connection import Client

from ddlcourse import selfcheck
from ddlcourse.exercises import simmpi, simtorch, simworld
from ddlcourse.exercises.simworld import Aborted, World


def install(world: World) -> None:
    """Make this process a simulated rank: ``mpi4py.MPI`` and ``torch.distributed`` talk to the referee."""
    simworld.WORLD = world
    import mpi4py
    mpi = simmpi.module(world)
    sys.modules["mpi4py.MPI"] = mpi
    mpi4py.MPI = mpi
    simtorch.patch(world)
    os.environ["DDLCOURSE_ALLOW_CPU"] = "1"         # the job's GPUs are the real run's, not the rehearsal's


def main(argv: list[str]) -> int:
    import cloudpickle

    address, key, rank = argv[0], argv[1], int(argv[2])
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    conn.send_bytes(pickle.dumps(("hello", rank, os.getpid())))
    job = pickle.loads(conn.recv_bytes())
    world = World(conn, rank, job["n"], job["sources"])
    install(world)
    simworld.install_sources(job["sources"])
    try:
        fn = cloudpickle.loads(job["fn"])
        v = selfcheck.run_checker(job["name"], fn, **job["kwargs"])
        world.send(("finish", v.ok, v.message))
    except Aborted:
        pass
    except BaseException as e:           # the checker itself failed: say it, as a verdict
        world.send(("finish", False, f"the checker failed on this rank: {type(e).__name__}: {e}"))
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)                          # no exit handlers: the process is done, and quickly


if __name__ == "__main__":
    # Run as the imported module, not as __main__: the checkers read this rank's world from
    # ddlcourse.exercises.simranks (rehearsal.calls), which must be the module that holds it.
    from ddlcourse.exercises import simranks
    simranks.main(sys.argv[1:])
