"""Build it: memory_per_gpu, the coding exercise 'layout_memory' of notebooks/30_sizing_a_layout.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise layout_memory exercises/sizing_a_layout/layout_memory.py

The checker loads the whole file, so helper functions you write here come with it.
"""


def memory_per_gpu(model, lay, act_per_layer):
    """Bytes on the busiest GPU (the first pipeline stage) of a dense model in mixed precision (layout.MIXED).

    model: a layout.Model; lay: a layout.Layout; act_per_layer: the activation bytes one layer keeps for one
    micro-batch on this GPU (given: layout.activation_bytes_per_layer(model, lay, 2)).
    Returns {"params", "grads", "optimizer", "activations", "total"} in bytes.
    """
    raise NotImplementedError   # your code here
