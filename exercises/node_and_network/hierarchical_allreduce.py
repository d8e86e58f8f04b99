"""Build it: my_hierarchical, the coding exercise 'hierarchical_allreduce' of notebooks/08_node_and_network.ipynb.

The notebook's build-it cell explains the task. Write your code below, then check it from a terminal in
the course folder:

    python -m ddlcourse check-exercise hierarchical_allreduce exercises/node_and_network/hierarchical_allreduce.py

It runs on 2 ranks that the command starts (--ranks N for another count); each rank loads the whole file, so helper
functions you write here come with it.
"""


def my_hierarchical(buf, comm, ranks_per_host):
    """Sum the NumPy array ``buf`` over all ranks of ``comm`` in place and return it, hierarchically: ranks
    r // ranks_per_host form one host; reduce onto each host's leader (its local rank 0), all-reduce among the
    leaders, broadcast inside each host. Free the communicators you split off."""
    from mpi4py import MPI
    raise NotImplementedError   # exercise 1: two Splits, then the three phases
