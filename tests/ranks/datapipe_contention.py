"""test_datapipe: every rank reads the contention files in ``sys.argv[1]`` in each pattern, on 1 and 2 ranks;
rank 0 prints what each read and how many bytes in all."""
import sys

from ddlcourse import storage
out = [storage.read_contention(sys.argv[1], p, k) for k in (1, 2) for p in storage.PATTERNS]
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    print([(r['pattern'], r['ranks'], r['bytes_total']) for r in out])
else:
    assert all(r is None for r in out)
