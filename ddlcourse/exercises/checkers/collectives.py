"""Checkers of notebooks/04_collectives.ipynb: its questions, and the ring allreduce the learner builds."""
import math

import numpy as np

from ddlcourse.exercises import rehearsal
from ddlcourse.exercises.solutions.collectives import RING_VARIANTS
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
RING_HINTS = {
    "off_by_one":
        "chunk index off by one in the reduce-scatter: at step s send chunk (r - s) % N to the right and add what "
        "you receive into chunk (r - s - 1) % N",
    "overwrite":
        "you overwrote a chunk with the one you received: in the reduce-scatter add it (chunk += received)",
    "rs_too_few":
        "one step too few in the reduce-scatter: it takes N - 1 steps (range(N - 1))",
    "ag_too_few":
        "one step too few in the allgather: it takes N - 1 steps too",
    "no_allgather":
        "allgather forgotten: after the reduce-scatter rank r holds only chunk (r + 1) % N complete; N - 1 more steps "
        "must pass the finished chunks around",
    "floor_chunks":
        "chunks of len // N elements drop the remainder, which is never reduced: cut the buffer into N chunks whose "
        "sizes differ by at most one (np.array_split)",
    "ag_off_by_one":
        "chunk index off by one in the allgather: at step s pass on the finished chunk (r + 1 - s) % N and receive "
        "chunk (r - s) % N",
}


def _ring_cases(n: int) -> list:
    """(shape, dtype) of the buffers tried on N ranks: divisible, not divisible, shorter than N, integer, 2-D."""
    return [((3 * n,), np.float64), ((3 * n + 1,), np.float64), ((max(n - 1, 1),), np.int64),
            ((2 * n + 1,), np.int32), ((3, 5), np.float32), ((4 * n + 2,), np.int64)]


def _ring_run(fn, comm, calls_per_case: list | None = None) -> list:
    """Each case's buffer after ``fn`` on this rank (data in -50..49, so every sum is exact in every dtype). In a
    rehearsal ``calls_per_case`` gets the learner's calls of each case."""
    out, calls = [], rehearsal.calls()
    for i, (shape, dtype) in enumerate(_ring_cases(comm.Get_size())):
        buf = np.random.default_rng([7, i, comm.Get_rank()]).integers(-50, 50, size=shape).astype(dtype)
        before = len(calls) if calls is not None else 0
        fn(buf, comm)
        out.append(buf)
        if calls is not None and calls_per_case is not None:
            calls_per_case.append(calls[before:])
    return out


def _ring_mechanism(calls_per_case: list, cases: list, n: int) -> str | None:
    """Is it a ring? Point-to-point messages only, each of one chunk, 2(N - 1) of them per rank (None: it is)."""
    for (shape, dtype), calls in zip(cases, calls_per_case):
        length = int(np.prod(shape))
        chunk = -(-length // n)                      # the largest chunk: array_split's sizes differ by at most one
        colls = [c for c in calls if c["kind"] == "coll"]
        if colls:
            return (f"your ring calls {colls[0]['name']}: a ring allreduce is made of point-to-point messages only "
                    "(comm.Sendrecv, or Send/Recv/Isend/Irecv), one chunk at a time; MPI's collectives are what it "
                    "replaces")
        sends = [c for c in calls if c["kind"] == "send"]
        big = max((c["count"] for c in sends), default=0)
        if big > chunk:
            return (f"for a buffer of {length} elements on {n} ranks a message of yours carries {big} elements: in a "
                    f"ring each message is one chunk (here at most {chunk}), or the ring sends more than the "
                    "2 (N - 1) / N of the buffer that makes it bandwidth-optimal")
        if len(sends) != 2 * (n - 1):
            return (f"for a buffer of {length} elements on {n} ranks this rank sent {len(sends)} messages: a ring "
                    f"takes 2 (N - 1) = {2 * (n - 1)} steps of one message each (N - 1 to reduce-scatter, N - 1 to "
                    "allgather)")
    return None


def _merge_same(wrong: dict, comm) -> dict:
    """Mistakes that give the same result on every rank (on 2 ranks an index off by one is also a step too few)
    share one message that names them all."""
    hints = list(wrong)
    same = [[all(comm.allgather(np.array_equal(wrong[a], wrong[b]))) for b in hints] for a in hints]
    return {" -- or -- ".join(b for j, b in enumerate(hints) if same[i][j]): wrong[a] for i, a in enumerate(hints)}


@code_exercise("ring_allreduce", distributed=True, ranks=(2, 3, 4), hints={
    "truncated": "A chunk index off by one? In the reduce-scatter, at step s send chunk (r - s) % N to the right "
                 "and add what arrives into chunk (r - s - 1) % N; in the allgather, send chunk (r + 1 - s) % N and "
                 "receive into chunk (r - s) % N: each receive is sized to the chunk it fills."})
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
    calls_per_case: list = []
    mine = _ring_run(fn, comm, calls_per_case)
    flat = lambda bufs: np.concatenate([b.reshape(-1).astype(np.float64) for b in bufs])   # noqa: E731
    wrong = _merge_same({hint: flat(_ring_run(RING_VARIANTS[kind], comm)) for kind, hint in RING_HINTS.items()},
                        comm) if n > 1 else {}
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
    if v.ok and rehearsal.calls() is not None:      # the numbers are right: is it a ring? (the rehearsal saw it)
        skipped = _ring_mechanism(calls_per_case, cases, n)
        v = Verdict(False, skipped) if skipped else v
    return agreed(v, comm)
