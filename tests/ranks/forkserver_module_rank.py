"""test_forkserver: a script run by helpers.run_ranks. With ``fail`` as its first argument every rank raises;
otherwise rank 0 prints, as JSON, its arguments, __name__, whether argv[0] is this file, sys.path[0] and the
working folder."""
import json
import os
import sys

from mpi4py import MPI

if sys.argv[1:2] == ["fail"]:
    raise ValueError("boom")
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps([sys.argv[1:], __name__, sys.argv[0] == __file__, sys.path[0], os.getcwd()]))
