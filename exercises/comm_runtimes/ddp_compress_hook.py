"""Build it: my_compress_hook, the coding exercise 'ddp_compress_hook' of notebooks/07_comm_runtimes.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise ddp_compress_hook exercises/comm_runtimes/ddp_compress_hook.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""
import torch


def my_compress_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: average bucket.buffer() over the ranks of state.process_group, sending a bucket
    of at least state.min_bytes bytes as float16 and a smaller one as it is; append the bytes of each message to
    state.bytes_sent. Return, without waiting, a future whose value is the bucket's buffer, averaged."""
    import torch.distributed as tdist
    raise NotImplementedError   # exercise 1: compress or not, divide, count, async allreduce, .then(copy back)
