"""Build it: my_ssp_server, the coding exercise 'ssp_server' of notebooks/09_parameter_server.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise ssp_server exercises/parameter_server/ssp_server.py

It runs on 3 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np


def my_ssp_server(comm, params, steps, staleness, lr, order):
    """Rank 0: serve workers 1..W (W = comm.Get_size() - 1) with stale-synchronous SGD; return ``params``.

    params: (P,) float64, updated in place. order: worker ranks, the order of the visits, repeated until every
    worker has had ``steps`` gradients applied. Receive gradients with tag ps.GRAD, send parameters with ps.PARAM.
    """
    raise NotImplementedError   # exercise 4: the visit loop, push (receive, apply), pull (within the bound)
