"""Build it: my_lamb_step, the coding exercise 'lamb_step' of notebooks/12_large_batch.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise lamb_step exercises/large_batch/lamb_step.py

The checker loads the whole file, so helper functions you write here come with it.
"""
import torch


def my_lamb_step(params, grads, state, lr, betas, eps, weight_decay):
    """One LAMB step, in place. params, grads: lists of tensors (grads[i] has the shape of params[i]);
    state: dict, empty at the first call (keep t, m and v in it); betas = (beta1, beta2); lr, eps,
    weight_decay: floats. Returns None."""
    raise NotImplementedError   # exercise 6: your code here
