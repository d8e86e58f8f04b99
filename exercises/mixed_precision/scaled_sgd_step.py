"""Build it: my_scaled_sgd_step, the coding exercise 'scaled_sgd_step' of notebooks/23_mixed_precision.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise scaled_sgd_step exercises/mixed_precision/scaled_sgd_step.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch


def my_scaled_sgd_step(params, loss, state, comm, lr=0.1, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """One SGD step with a dynamic loss scale, on a rank that holds its own shard of the model.

    params: this rank's parameters, fp32 tensors that require grad (.grad is None on entry)
    loss:   this rank's loss, a scalar tensor (backward not called yet)
    state:  {"scale": float, "tracker": int (clean steps in a row)}; update it in place
    comm:   mpi4py's communicator; comm.allreduce(x) sums the Python number x over the ranks
    Returns True when the step was taken, False when it was skipped (the same on every rank).
    """
    raise NotImplementedError   # your code here
