"""Checkers of notebooks/24_profiling.ipynb: the exposed communication, the straggler, and the model of DDP's buckets
on one stream the learner builds."""
from ddlcourse import profiling
from ddlcourse.exercises.solutions.profiling import BUCKET_MODEL, BUCKET_VARIANTS, EXPOSED_VARIANTS, STRAGGLER_VARIANTS
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

# A backward pass with three compute pieces and three bucket allreduces (seconds): the first two buckets
# overlap the compute that follows them, partly or fully; the last one is all exposed. Two of the
# allreduces overlap each other (gloo runs them on two threads), and so do two compute pieces.
COMPUTE = [(0.0, 4.0), (3.0, 6.0), (7.0, 9.0)]
COMM = [(2.0, 5.0), (4.5, 7.5), (9.0, 10.5), (10.0, 11.0)]


EXPOSED_HINTS = {
    "all_comm": "you summed the communication time without taking off the part hidden behind compute",
    "union_only": "merging overlapping allreduces is right, but the time during which compute runs is not exposed: "
                  "subtract the union of the compute intervals",
    "minus_compute_total": "you subtracted all compute time; subtract only the compute that overlaps communication "
                           "(interval by interval)",
    "no_union": "two allreduces overlap each other: merge the communication intervals first, so no time is "
                "counted twice",
}


@code_exercise("exposed_comm")
def check_exposed(fn, **_):
    ref = profiling.exposed_comm(COMM, COMPUTE)
    ans = fn(list(COMM), list(COMPUTE))
    try:
        ans = float(ans)
    except (TypeError, ValueError):
        return Verdict(False, f"return the exposed seconds as a number, got {ans!r}")
    wrong = {hint: EXPOSED_VARIANTS[kind](COMM, COMPUTE) for kind, hint in EXPOSED_HINTS.items()}
    return diagnose(ans, ref, wrong, what="the exposed communication")


# allreduce wait per rank (seconds) in four runs; the straggler is the rank that waits least
WAITS = [[0.21, 0.01, 0.20, 0.22], [0.03, 0.35, 0.34, 0.33, 0.36, 0.31, 0.30, 0.35], {0: 0.4, 1: 0.41, 2: 0.02},
         {3: 0.4, 5: 0.02, 7: 0.41}]


@code_exercise("find_straggler")
def check_straggler(fn, **_):
    for waits in WAITS:
        ref = profiling.find_straggler(waits)
        ans = fn(dict(waits) if isinstance(waits, dict) else list(waits))
        if ans == ref:
            continue
        if ans == STRAGGLER_VARIANTS["longest"](waits):
            return Verdict(False, "you named the rank that waits longest. The others wait *for* the straggler: "
                                  "it reaches the allreduce last and waits least")
        if ans == STRAGGLER_VARIANTS["wait"](waits):
            return Verdict(False, f"for waits {waits} you returned the shortest wait, {ans}, not its rank")
        if isinstance(waits, dict) and ans == STRAGGLER_VARIANTS["position"](waits):
            return Verdict(False, f"for waits {waits} you returned the position {ans} of the shortest wait; "
                                  "in a dict the rank is the key")
        return Verdict(False, f"for waits {waits} you named rank {ans!r}; the straggler is rank {ref}")
    return Verdict(True)


# --------------------------------------------------------------------------- build it: DDP's buckets on one stream
# (bucket ready times, allreduce durations, end of the backward), seconds; buckets in DDP's order
BUCKET_CASES = [
    ([1.0, 2.0, 2.5, 4.0], [1.5, 0.4, 1.0, 0.5], 4.0),      # a queue forms behind the first bucket
    ([1.0, 1.5, 2.0], [1.0, 1.0, 1.0], 2.2),                 # the allreduces are longer than the gaps
    ([0.5, 1.0], [0.3, 0.2], 3.0),                           # all hidden: nothing exposed
    ([1.0, 0.5, 2.0], [1.0, 0.2, 0.5], 2.0),                 # bucket 1 is ready before bucket 0
]

BUCKET_HINTS = {
    "serialize": "the allreduces run on one communication stream, one after the other: each starts at "
                 "max(its bucket's ready time, the end of the previous allreduce), not at its ready time",
    "in_order": "DDP launches the allreduces in bucket order: do not sort the buckets by ready time",
    "wait_ready": "an allreduce cannot start before its bucket is ready: start = max(ready, previous end)",
    "clamp": "the exposed time cannot be negative: when the last allreduce ends before the backward, it is 0",
    "hidden_share": "the overlap fraction is the hidden share of the communication, (total - exposed) / total",
}
ZIP_HINT = ("ready and durations of different lengths must raise ValueError; zip() stops at the shorter list "
            "and would drop a bucket silently")


def _bucket_answers(fn):
    out = []
    for ready, durations, end in BUCKET_CASES:
        ends, exposed, share = fn(list(ready), list(durations), end)
        out.extend([*map(float, ends), float(exposed), float(share)])
    return out


@code_exercise("bucket_overlap")
def check_bucket_overlap(fn, **_):
    """``fn(ready, durations, backward_end) -> (ends, exposed, overlap)`` on four cases, against the right
    model; then a call with one duration missing must raise ValueError."""
    got = _bucket_answers(fn)
    # the right model comes from the solutions module: perfmodel.comm_schedule spaces the buckets evenly, it takes
    # no ready times
    v = diagnose(got, _bucket_answers(BUCKET_MODEL),
                 {hint: _bucket_answers(BUCKET_VARIANTS[k]) for k, hint in BUCKET_HINTS.items()},
                 rtol=1e-9, atol=1e-12, what="[end of each allreduce..., exposed, overlap] over the four cases")
    if not v.ok:
        return v
    try:
        fn([1.0, 2.0, 3.0], [0.5, 0.5], 3.0)
    except ValueError:
        return Verdict(True)
    return Verdict(False, ZIP_HINT)
