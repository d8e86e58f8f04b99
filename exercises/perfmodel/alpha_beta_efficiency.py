"""Build it: predict_efficiency, the coding exercise 'alpha_beta_efficiency' of notebooks/29_perfmodel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise alpha_beta_efficiency exercises/perfmodel/alpha_beta_efficiency.py

The checker loads the whole file, so helper functions you write here come with it.
"""
import numpy as np


def predict_efficiency(sizes, times, n_params, t_compute, world_sizes):
    """Fit t = alpha + n * beta to the timings (sizes in bytes, shape (M,)); return the efficiency of
    data parallelism with a ring allreduce of the fp32 gradients on each N of world_sizes, shape (W,)."""
    raise NotImplementedError   # your code here
