"""Build it: MyTPMLP, the coding exercise 'tp_mlp' of notebooks/20_tensor_sequence_parallel.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise tp_mlp exercises/tensor_sequence_parallel/tp_mlp.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch
import torch.distributed as tdist


class MyTPMLP(torch.nn.Module):
    """The MLP y = fc2(gelu(fc1(x))), dim -> hidden -> dim, split over the ranks (Megatron-LM).

    fc1, fc2: the serial nn.Linear layers, the same on every rank; k = hidden // world.
    self.fc1: nn.Linear(dim, k), rows rank*k .. (rank+1)*k - 1 of fc1 (column parallel).
    self.fc2: nn.Linear(k, dim), the matching columns of fc2's weight and its whole bias (row parallel).
    forward: x (batch, dim) -> (batch, dim), the same on every rank.
    """

    class f(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise NotImplementedError   # your code here

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError   # your code here

    class g(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise NotImplementedError   # your code here

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError   # your code here

    def __init__(self, fc1, fc2, rank, world):
        super().__init__()
        raise NotImplementedError       # your code here

    def forward(self, x):
        raise NotImplementedError       # your code here
