"""Build it: my_bucket_overlap, the coding exercise 'bucket_overlap' of notebooks/24_profiling.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise bucket_overlap exercises/profiling/bucket_overlap.py

The checker loads the whole file, so helper functions you write here come with it.
"""


def my_bucket_overlap(ready, durations, backward_end):
    """ready, durations: lists of seconds, one per bucket in DDP's order; backward_end: seconds.
    Returns (ends, exposed, overlap): when each bucket's allreduce ends (a list), the seconds of
    communication after backward_end (>= 0), and the hidden share of all communication."""
    raise NotImplementedError   # exercise 4: your code here
