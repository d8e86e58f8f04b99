"""Build it: SplitBackwardMLP, the coding exercise 'zero_bubble_split' of notebooks/17_pipeline_schedules.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise zero_bubble_split exercises/pipeline_schedules/zero_bubble_split.py

The checker loads the whole file, so helper functions you write here come with it.
"""
import torch


class SplitBackwardMLP:
    """y = relu(x @ w1.T + b1) @ w2.T + b2 with its backward split into B (input gradient) and W (weight gradients).

    x: (n, d_in); w1: (d_hidden, d_in); b1: (d_hidden,); w2: (d_out, d_hidden); b2: (d_out,). Plain tensors,
    no autograd. B and W each work on the oldest micro-batch that still waits for them.
    """

    def __init__(self, w1, b1, w2, b2):
        raise NotImplementedError   # your code here

    def forward(self, x):
        """x (n, d_in) -> y (n, d_out); keep what B and W need."""
        raise NotImplementedError   # your code here

    def backward_input(self, grad_out):
        """B: grad_out = dL/dy (n, d_out) -> dL/dx (n, d_in); keep what this micro-batch's W needs."""
        raise NotImplementedError   # your code here

    def backward_weight(self):
        """W: (dL/dw1, dL/db1, dL/dw2, dL/db2), of the shapes of w1, b1, w2, b2."""
        raise NotImplementedError   # your code here
