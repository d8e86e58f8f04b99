"""Build it: my_ring_allreduce, the coding exercise 'ring_allreduce' of notebooks/04_collectives.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise ring_allreduce exercises/collectives/ring_allreduce.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np


def my_ring_allreduce(buf, comm):
    """Sum the NumPy array ``buf`` over all ranks of ``comm`` in place and return it.

    buf: any shape, any number of elements L (also L < N or L not divisible by N), integer or float dtype.
    The ring: N - 1 reduce-scatter steps, then N - 1 allgather steps, with comm.Sendrecv only.
    """
    r, n = comm.Get_rank(), comm.Get_size()
    raise NotImplementedError   # exercise 5: chunks as views into buf, reduce-scatter, allgather
