"""Exercises of notebooks/08b_profiling.ipynb."""
from ddlcourse import profiling
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

# A backward pass with three compute pieces and three bucket allreduces (seconds): the first two buckets
# overlap the compute that follows them, partly or fully; the last one is all exposed. Two of the
# allreduces overlap each other (gloo runs them on two threads), and so do two compute pieces.
COMPUTE = [(0.0, 4.0), (3.0, 6.0), (7.0, 9.0)]
COMM = [(2.0, 5.0), (4.5, 7.5), (9.0, 10.5), (10.0, 11.0)]


def _all_comm(comm, compute):          # no overlap taken off: every allreduce counted in full
    return sum(b - a for a, b in comm)


def _union_only(comm, compute):        # overlaps between allreduces merged, but compute ignored
    return profiling.total(comm)


def _minus_compute_total(comm, compute):   # comm minus all compute time (not minus the overlap)
    return max(0.0, profiling.total(comm) - profiling.total(compute))


def _no_union(comm, compute):          # each allreduce minus compute, the two overlapping ones counted twice
    return sum(profiling.exposed_comm([c], compute) for c in comm)


@code_exercise("exposed_comm")
def check_exposed(fn, **_):
    ref = profiling.exposed_comm(COMM, COMPUTE)
    ans = fn(list(COMM), list(COMPUTE))
    try:
        ans = float(ans)
    except (TypeError, ValueError):
        return Verdict(False, f"return the exposed seconds as a number, got {ans!r}")
    return diagnose(ans, ref, {
        "you summed the communication time without taking off the part hidden behind compute":
            _all_comm(COMM, COMPUTE),
        "merging overlapping allreduces is right, but the time during which compute runs is not exposed: "
        "subtract the union of the compute intervals": _union_only(COMM, COMPUTE),
        "you subtracted all compute time; subtract only the compute that overlaps communication "
        "(interval by interval)": _minus_compute_total(COMM, COMPUTE),
        "two allreduces overlap each other: merge the communication intervals first, so no time is "
        "counted twice": _no_union(COMM, COMPUTE),
    }, what="the exposed communication")


# allreduce wait per rank (seconds) in three runs; the straggler is the rank that waits least
WAITS = [[0.21, 0.01, 0.20, 0.22], [0.03, 0.35, 0.34, 0.33, 0.36, 0.31, 0.30, 0.35], {0: 0.4, 1: 0.41, 2: 0.02}]


@code_exercise("find_straggler")
def check_straggler(fn, **_):
    for waits in WAITS:
        ref = profiling.find_straggler(waits)
        ans = fn(dict(waits) if isinstance(waits, dict) else list(waits))
        if ans == ref:
            continue
        items = waits.items() if isinstance(waits, dict) else enumerate(waits)
        longest = max(items, key=lambda kv: kv[1])[0]
        if ans == longest:
            return Verdict(False, "you named the rank that waits longest. The others wait *for* the straggler: "
                                  "it reaches the allreduce last and waits least")
        return Verdict(False, f"for waits {waits} you named rank {ans!r}; the straggler is rank {ref}")
    return Verdict(True)
