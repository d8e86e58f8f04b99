"""test_forkserver: run as ``-c CODE`` on purpose (its text, by helpers.run_mpi): a forked rank runs its code as
``python -c`` does. Rank 0 prints whether it was forked, sys.argv, __name__, a function's module, a sum over the
ranks, whether the ranks drew different random numbers, sys.path[0] and the working folder."""
import os
PARENT = open(f'/proc/{os.getppid()}/cmdline', 'rb').read().replace(b'\0', b' ').decode()
import sys, random, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
draws = c.gather((random.random(), float(np.random.rand())))
total = c.allreduce(c.rank + 1)
def f(): pass
if c.rank == 0:
    print('forked', 'forkserver.py serve' in PARENT, sys.argv, __name__, f.__module__, total,
          len(set(draws)) == len(draws), repr(sys.path[0]), os.getcwd())
