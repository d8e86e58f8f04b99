"""Exercises of notebooks/04_collectives.ipynb."""
import math

import numpy as np

from ddlcourse.selfcheck import code_exercise, diagnose, exercise


@exercise("ring_bytes_per_rank", "reduce-scatter and allgather each send N-1 chunks of n/N bytes")
def ring_bytes_per_rank(nbytes: float, n_ranks: int) -> float:
    return 2 * (n_ranks - 1) / n_ranks * nbytes


@exercise("recursive_doubling_rounds", "each round doubles the number of ranks whose data you hold")
def recursive_doubling_rounds(n_ranks: int) -> int:
    return int(math.ceil(math.log2(n_ranks)))


@exercise("alpha_beta_crossover", "the message size at which the latency term "
          "and the bandwidth term of T = alpha + beta * n are equal")
def alpha_beta_crossover(alpha: float, beta: float) -> float:
    return alpha / beta


# --------------------------------------------------------------------------- coding exercise: the ring's reduce-scatter
def _rs_variant(send_off: int, recv_off: int, steps_extra: int = 0, overwrite: bool = False):
    """A reduce-scatter that sends chunk (r - s + send_off) and receives chunk (r - s + recv_off)."""
    def rs(chunks, comm):
        r, n = comm.Get_rank(), comm.Get_size()
        right, left = (r + 1) % n, (r - 1) % n
        tmp = np.empty(len(chunks[0]), dtype=chunks[0].dtype)
        for s in range(n - 1 + steps_extra):
            send_c, recv_c = chunks[(r - s + send_off) % n], chunks[(r - s + recv_off) % n]
            comm.Sendrecv(send_c, dest=right, recvbuf=tmp[:len(recv_c)], source=left)
            if overwrite:
                recv_c[:] = tmp[:len(recv_c)]
            else:
                recv_c += tmp[:len(recv_c)]
        return chunks
    return rs


@code_exercise("ring_reduce_scatter", distributed=True)
def check_ring_reduce_scatter(fn, **_):
    """On every rank: ``fn(chunks, comm)`` must leave the same chunks as ``collectives.ring_reduce_scatter``
    (rank r then holds the full sum of chunk (r + 1) mod N). Equal chunk sizes, so no wrong variant can
    truncate a message."""
    from mpi4py import MPI

    from ddlcourse import collectives

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    data = np.random.default_rng([11, r]).integers(-50, 50, size=3 * n).astype(np.float64)  # exact sums

    def state(f):
        chunks = np.array_split(data.copy(), n)
        f(chunks, comm)
        return np.concatenate(chunks)

    ref = state(collectives.ring_reduce_scatter)
    mistakes = {
        "chunk index off by one: at step s send chunk (r - s) % N and receive into chunk (r - s - 1) % N":
            state(_rs_variant(-1, -2)),
        "chunk index off by one: at step s send chunk (r - s) % N and receive into chunk (r - s - 1) % N, "
        "not (r - s + 1) and (r - s)": state(_rs_variant(1, 0)),
        "you overwrote the chunk with the one you received: add it (chunk += received)":
            state(_rs_variant(0, -1, overwrite=True)),
        "one step too many: reduce-scatter takes N - 1 steps, an N-th adds a partial sum twice":
            state(_rs_variant(0, -1, steps_extra=1)),
        "one step too few: reduce-scatter takes N - 1 steps (range(N - 1))": state(_rs_variant(0, -1, steps_extra=-1)),
    }
    if n == 1:
        mistakes = {}
    ans = state(fn)
    total = np.empty_like(data)
    comm.Allreduce(data, total, op=MPI.SUM)
    owned = (r + 1) % n
    v = diagnose(ans, ref, mistakes, rtol=0, atol=1e-9, what=f"rank {r}'s chunks after your reduce-scatter")
    if not v.ok and np.allclose(np.array_split(ans, n)[owned], np.array_split(total, n)[owned]):
        v.message += f" (chunk {owned}, the one rank {r} must own, is right: check the partial chunks)"
    return v
