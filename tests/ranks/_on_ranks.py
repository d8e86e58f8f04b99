"""What every exercise check on real ranks starts and ends with (``helpers.check_on_ranks`` runs such a script).

A script imports what it uses of ``MPI``, ``RANK``, ``run_checker``, ``reject`` and ``reject_somewhere`` from
here, and calls :func:`finish` last: it prints one line from rank 0 once every rank got there (the line
``check_on_ranks`` looks for), then tears the process group down.
"""
import sys

from mpi4py import MPI

from ddlcourse.selfcheck import run_checker

__all__ = ["MPI", "RANK", "run_checker", "reject", "reject_somewhere", "finish"]

RANK = MPI.COMM_WORLD.Get_rank()


def reject(name, wrong, hint):
    """Every rank rejects ``wrong``, with a message that names the mistake."""
    v = run_checker(name, wrong)
    assert not v.ok and hint in v.message, (RANK, hint, v.message)


def reject_somewhere(name, wrong, hint):
    """A mistake may leave some ranks right (the last stage's gradient is right whatever the others do): it
    must be caught on at least one rank, and named on every rank that catches it."""
    v = run_checker(name, wrong)
    vs = MPI.COMM_WORLD.allgather((v.ok, v.message))
    assert not all(ok for ok, _ in vs) and all(ok or hint in msg for ok, msg in vs), (hint, vs)


def finish():
    """One line from rank 0 once every rank got here, then the process group torn down."""
    oks = MPI.COMM_WORLD.gather(RANK)
    if RANK == 0:
        print("checked on ranks", sorted(oks))
    if "ddlcourse.dist" in sys.modules:
        sys.modules["ddlcourse.dist"].shutdown()
