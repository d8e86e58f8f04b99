"""Build it: my_global_mean_grad, the coding exercise 'global_mean_grad' of notebooks/03_loss_integrity.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise global_mean_grad exercises/loss_integrity/global_mean_grad.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch
import torch.distributed as tdist


def my_global_mean_grad(model, x, y, loss_fn, group=None):
    """Leave in every p.grad the gradient of the mean loss over ALL ranks' samples; return that loss (a float).

    x: (m_r, d) and y: (m_r,), this rank's share (m_r differs between ranks); loss_fn(model(x), y): (m_r,) losses.
    """
    raise NotImplementedError   # exercise 6: losses, all-reduce (sum, count), zero_grad, backward, all-reduce grads
