"""Build it: exposed_comm, the coding exercise 'exposed_comm' of notebooks/24_profiling.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise exposed_comm exercises/profiling/exposed_comm.py

The checker loads the whole file, so helper functions you write here come with it.
"""


def exposed_comm(comm_intervals, compute_intervals):
    """Seconds covered by some communication interval and by no compute interval."""
    raise NotImplementedError   # your code here
