"""Build it: head_step, the coding exercise 'driving_view_head' of labs/04_driving.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise driving_view_head exercises/driving/driving_view_head.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import numpy as np
import torch


def head_step(head, feats, target, loss_fn, scale, send, recv):
    """One micro-batch on the head rank. Returns its loss (a detached 0-d tensor); leaves the gradients in .grad.

    head: the fusion head (nn.Module), input (micro_batch, n_views * features). feats: one entry per view, a
    tensor (micro_batch, features) computed on this rank, or the int rank that sends it. target: (micro_batch,).
    loss_fn(logits, target): the summed loss. scale: divide the loss by it. send(t, dst), recv(src) -> tensor.
    """
    raise NotImplementedError   # your code here
