"""Build it: stage_step, the coding exercise 'stage_send_recv' of notebooks/15_model_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise stage_send_recv exercises/model_parallel/stage_send_recv.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch


def stage_step(stage, x, y, loss_fn, rank, world, send, recv):
    """Forward and backward of one batch through stage `rank` of `world` stages; gradients left in `stage`.

    stage: this rank's nn.Module. x: (batch, features) on rank 0, else None. y: (batch,) class labels on the
    last rank, else None. send(t, dst): sends tensor t to rank dst. recv(buf, src): fills buf (a tensor of the
    shape that was sent) with the tensor from rank src. Returns nothing.
    """
    raise NotImplementedError   # your code here
