"""Run ``python -m ddlcourse check`` on every rank, then report where each rank ran (tests/test_multinode.py).

    srun --mpi=pmi2 -N2 -n4 python env/multinode/probe.py [check options]
    mpiexec -n 4 python env/multinode/probe.py

The check runs exactly as ``python -m ddlcourse check`` does (same function, same output). Afterwards rank 0
prints one line ``PROBE {json}``: per rank its hostname, ``dist.local_rank()``, the address and port
torch.distributed met at (``dist.rendezvous()``), and the check's exit status. The test reads that line
to see what the check itself does not print: the hosts, the local ranks, and that the rendezvous was on the
node network rather than loopback.
"""
from __future__ import annotations

import json
import socket
import sys


def main(argv: list[str]) -> int:
    from mpi4py import MPI

    from ddlcourse import dist
    from ddlcourse.__main__ import main as ddlcourse_main

    rc = ddlcourse_main(["check", *argv])
    rendezvous = dist.rendezvous() if hasattr(dist, "rendezvous") else None
    row = {"rank": dist.rank(), "host": socket.gethostname(), "local_rank": dist.local_rank(),
           "rendezvous": list(rendezvous) if rendezvous else None, "rc": rc}
    rows = MPI.COMM_WORLD.gather(row, root=0)
    if dist.rank() == 0:
        print("PROBE " + json.dumps(rows), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
