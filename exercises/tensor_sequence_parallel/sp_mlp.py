"""Build it: MySPMLP, the coding exercise 'sp_mlp' of notebooks/20_tensor_sequence_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise sp_mlp exercises/tensor_sequence_parallel/sp_mlp.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch
import torch.distributed as tdist


class MySPMLP(torch.nn.Module):
    """x + fc2(gelu(fc1(ln(x)))) under tensor + sequence parallelism, on this rank's tokens.

    ln, fc1, fc2: the serial nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.Linear(hidden, dim), the same on
    every rank; k = hidden // world. self.ln: whole; self.fc1, self.fc2: the column and row shards.
    forward: x (batch, s/t, dim), chunk `rank` of the sequence -> (batch, s/t, dim).
    sync_grads(): all-reduce the gradients that are partial sums over the tokens.
    """

    class gather_seq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise NotImplementedError   # your code here

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError   # your code here

    class scatter_seq(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise NotImplementedError   # your code here

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError   # your code here

    def __init__(self, ln, fc1, fc2, rank, world):
        super().__init__()
        raise NotImplementedError       # your code here

    def forward(self, x):
        raise NotImplementedError       # your code here

    def sync_grads(self):
        raise NotImplementedError       # your code here
