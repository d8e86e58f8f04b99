"""Exercises of notebooks/04_collectives.ipynb."""
import math

import numpy as np

from ddlcourse.selfcheck import Verdict, agreed, code_exercise, diagnose, exercise


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


# --------------------------------------------------------------------------- build it: the whole ring allreduce
def ring_allreduce(buf, comm):
    """The reference a learner would write: reduce-scatter, then allgather, in place on ``buf``."""
    r, n = comm.Get_rank(), comm.Get_size()
    flat = buf.reshape(-1)                                  # a view: writing into flat writes into buf
    chunks = np.array_split(flat, n)                        # n views, sizes differ by at most one
    right, left = (r + 1) % n, (r - 1) % n
    tmp = np.empty(len(chunks[0]), dtype=flat.dtype)        # the largest chunk comes first
    for s in range(n - 1):                                  # reduce-scatter
        send_c, recv_c = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        comm.Sendrecv(send_c, dest=right, recvbuf=tmp[:len(recv_c)], source=left)
        recv_c += tmp[:len(recv_c)]
    for s in range(n - 1):                                  # allgather: pass the finished chunks on
        send_c, recv_c = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.Sendrecv(send_c, dest=right, recvbuf=recv_c, source=left)
    return buf


def _ring_variant(send_off=0, recv_off=-1, rs_extra=0, ag_extra=0, overwrite=False, allgather=True,
                  floor_chunks=False, ag_off=0):
    """A ring allreduce with one typical mistake. Every message is received into a buffer of the largest chunk
    (then copied), so a variant never truncates a message and never hangs: it only computes a wrong sum."""
    def ring(buf, comm):
        r, n = comm.Get_rank(), comm.Get_size()
        flat = buf.reshape(-1)
        if floor_chunks:                                    # size len // n: the remainder is never reduced
            c = len(flat) // n
            chunks = [flat[i * c:(i + 1) * c] for i in range(n)]
        else:
            chunks = np.array_split(flat, n)
        right, left = (r + 1) % n, (r - 1) % n
        tmp = np.zeros(max(len(ch) for ch in chunks) + 1, dtype=flat.dtype)
        for s in range(n - 1 + rs_extra):
            send_c, recv_c = chunks[(r - s + send_off) % n], chunks[(r - s + recv_off) % n]
            comm.Sendrecv(send_c, dest=right, recvbuf=tmp, source=left)
            if overwrite:
                recv_c[:] = tmp[:len(recv_c)]
            else:
                recv_c += tmp[:len(recv_c)]
        for s in range(n - 1 + ag_extra if allgather else 0):
            send_c, recv_c = chunks[(r + 1 - s + ag_off) % n], chunks[(r - s + ag_off) % n]
            comm.Sendrecv(send_c, dest=right, recvbuf=tmp, source=left)
            recv_c[:] = tmp[:len(recv_c)]
        return buf
    return ring


_off_by_one = _ring_variant(-1, -2)
_overwrite = _ring_variant(overwrite=True)
_rs_too_few = _ring_variant(rs_extra=-1)
_ag_too_few = _ring_variant(ag_extra=-1)
_no_allgather = _ring_variant(allgather=False)
_floor_chunks = _ring_variant(floor_chunks=True)
_ag_off_by_one = _ring_variant(ag_off=1)

# (One step too MANY is harmless here: the extra step only passes finished chunks on again.)
RING_MISTAKES = {
    "chunk index off by one in the reduce-scatter: at step s send chunk (r - s) % N to the right and add what "
    "you receive into chunk (r - s - 1) % N": _off_by_one,
    "you overwrote a chunk with the one you received: in the reduce-scatter add it (chunk += received)": _overwrite,
    "one step too few in the reduce-scatter: it takes N - 1 steps (range(N - 1))": _rs_too_few,
    "one step too few in the allgather: it takes N - 1 steps too": _ag_too_few,
    "allgather forgotten: after the reduce-scatter rank r holds only chunk (r + 1) % N complete; N - 1 more steps "
    "must pass the finished chunks around": _no_allgather,
    "chunks of len // N elements drop the remainder, which is never reduced: cut the buffer into N chunks whose "
    "sizes differ by at most one (np.array_split)": _floor_chunks,
    "chunk index off by one in the allgather: at step s pass on the finished chunk (r + 1 - s) % N and receive "
    "chunk (r - s) % N": _ag_off_by_one,
}


def _ring_cases(n: int) -> list:
    """(shape, dtype) of the buffers tried on N ranks: divisible, not divisible, shorter than N, integer, 2-D."""
    return [((3 * n,), np.float64), ((3 * n + 1,), np.float64), ((max(n - 1, 1),), np.int64),
            ((2 * n + 1,), np.int32), ((3, 5), np.float32), ((4 * n + 2,), np.int64)]


def _ring_run(fn, comm) -> list:
    """Each case's buffer after ``fn`` on this rank (data in -50..49, so every sum is exact in every dtype)."""
    out = []
    for i, (shape, dtype) in enumerate(_ring_cases(comm.Get_size())):
        buf = np.random.default_rng([7, i, comm.Get_rank()]).integers(-50, 50, size=shape).astype(dtype)
        fn(buf, comm)
        out.append(buf)
    return out


def _merge_same(wrong: dict, comm) -> dict:
    """Mistakes that give the same result on every rank (on 2 ranks an index off by one is also a step too few)
    share one message that names them all."""
    hints = list(wrong)
    same = [[all(comm.allgather(np.array_equal(wrong[a], wrong[b]))) for b in hints] for a in hints]
    return {" -- or -- ".join(b for j, b in enumerate(hints) if same[i][j]): wrong[a] for i, a in enumerate(hints)}


@code_exercise("ring_allreduce", distributed=True, solution=ring_allreduce, ranks=(2, 3, 4),
               mistakes=[(_off_by_one, "chunk index off by one in the reduce-scatter"),
                         (_overwrite, "you overwrote a chunk"), (_rs_too_few, "one step too few in the reduce"),
                         (_no_allgather, "allgather forgotten"), (_floor_chunks, "drop the remainder"),
                         (_ag_off_by_one, "chunk index off by one in the allgather")])
def check_ring_allreduce(fn, **_):
    """On every rank: ``fn(buf, comm)`` must leave in ``buf`` what ``MPI_Allreduce`` (SUM) gives, for buffers of
    several lengths (divisible by N or not, shorter than N), shapes and dtypes. The ranks agree on one verdict."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    cases = _ring_cases(n)
    refs = []
    for i, (shape, dtype) in enumerate(cases):
        x = np.random.default_rng([7, i, r]).integers(-50, 50, size=shape).astype(dtype)
        total = np.empty_like(x)
        comm.Allreduce(x, total, op=MPI.SUM)
        refs.append(total)
    mine = _ring_run(fn, comm)
    flat = lambda bufs: np.concatenate([b.reshape(-1).astype(np.float64) for b in bufs])   # noqa: E731
    wrong = _merge_same({hint: flat(_ring_run(f, comm)) for hint, f in RING_MISTAKES.items()}, comm) if n > 1 else {}
    v = diagnose(flat(mine), flat(refs), wrong, rtol=0, atol=0, what="your buffers")
    if not v.ok and v.message.startswith("your buffers"):
        bad = [i for i, (a, b) in enumerate(zip(mine, refs)) if not np.array_equal(a, b)]
        ints = [i for i, (_, dt) in enumerate(cases) if np.issubdtype(dt, np.integer)]
        uneven = [i for i, (shape, _) in enumerate(cases) if int(np.prod(shape)) % n]
        shape, dtype = cases[bad[0]]
        v.message = (f"for a {np.dtype(dtype).name} buffer of shape {shape} on {n} ranks, rank {r} holds "
                     f"{mine[bad[0]].reshape(-1)[:6].tolist()}..., MPI_Allreduce gives "
                     f"{refs[bad[0]].reshape(-1)[:6].tolist()}...")
        if set(bad) <= set(ints):
            v.message += ": right on float buffers, wrong on integer ones: give the receive buffer buf's dtype"
        elif set(bad) <= set(uneven):
            v.message += (": right when N divides the length, wrong otherwise: chunks of sizes that differ by at most "
                          "one, and each receive sized to the chunk it fills")
    return agreed(v, comm)
