"""Exercises of notebooks/24_profiling.ipynb."""
from ddlcourse import profiling
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

# A backward pass with three compute pieces and three bucket allreduces (seconds): the first two buckets
# overlap the compute that follows them, partly or fully; the last one is all exposed. Two of the
# allreduces overlap each other (gloo runs them on two threads), and so do two compute pieces.
COMPUTE = [(0.0, 4.0), (3.0, 6.0), (7.0, 9.0)]
COMM = [(2.0, 5.0), (4.5, 7.5), (9.0, 10.5), (10.0, 11.0)]


def my_exposed_comm(comm_intervals, compute_intervals):
    """The reference a learner would write: merge each set of intervals, then take off the overlap."""
    def union(intervals):
        merged = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return merged

    exposed = 0.0
    compute = union(compute_intervals)
    for a, b in union(comm_intervals):
        hidden = sum(max(0.0, min(b, d) - max(a, c)) for c, d in compute)
        exposed += (b - a) - hidden
    return exposed


def _all_comm(comm, compute):          # no overlap taken off: every allreduce counted in full
    return sum(b - a for a, b in comm)


def _union_only(comm, compute):        # overlaps between allreduces merged, but compute ignored
    return profiling.total(comm)


def _minus_compute_total(comm, compute):   # comm minus all compute time (not minus the overlap)
    return max(0.0, profiling.total(comm) - profiling.total(compute))


def _no_union(comm, compute):          # each allreduce minus compute, the two overlapping ones counted twice
    return sum(profiling.exposed_comm([c], compute) for c in comm)


@code_exercise("exposed_comm", solution=my_exposed_comm, mistakes=[
    (_all_comm, "without taking off the part hidden"), (_union_only, "subtract the union of the compute"),
    (_minus_compute_total, "subtracted all compute time"), (_no_union, "merge the communication intervals")])
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


# allreduce wait per rank (seconds) in four runs; the straggler is the rank that waits least
WAITS = [[0.21, 0.01, 0.20, 0.22], [0.03, 0.35, 0.34, 0.33, 0.36, 0.31, 0.30, 0.35], {0: 0.4, 1: 0.41, 2: 0.02},
         {3: 0.4, 5: 0.02, 7: 0.41}]


def my_find_straggler(waits):
    """The reference a learner would write: the rank with the shortest wait."""
    items = waits.items() if isinstance(waits, dict) else enumerate(waits)
    return min(items, key=lambda kv: kv[1])[0]


def _straggler_longest(waits):
    items = waits.items() if isinstance(waits, dict) else enumerate(waits)
    return max(items, key=lambda kv: kv[1])[0]


def _straggler_wait(waits):
    return min(waits.values() if isinstance(waits, dict) else waits)


def _straggler_position(waits):
    values = list(waits.values()) if isinstance(waits, dict) else list(waits)
    return values.index(min(values))


@code_exercise("find_straggler", solution=my_find_straggler, mistakes=[
    (_straggler_longest, "waits longest"), (_straggler_wait, "not its rank"), (_straggler_position, "position")])
def check_straggler(fn, **_):
    for waits in WAITS:
        ref = profiling.find_straggler(waits)
        ans = fn(dict(waits) if isinstance(waits, dict) else list(waits))
        if ans == ref:
            continue
        if ans == _straggler_longest(waits):
            return Verdict(False, "you named the rank that waits longest. The others wait *for* the straggler: "
                                  "it reaches the allreduce last and waits least")
        if ans == _straggler_wait(waits):
            return Verdict(False, f"for waits {waits} you returned the shortest wait, {ans}, not its rank")
        if isinstance(waits, dict) and ans == _straggler_position(waits):
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


def my_bucket_overlap(ready, durations, backward_end):
    """The reference a learner would write: replay the buckets' allreduces on one communication stream."""
    if len(ready) != len(durations):
        raise ValueError("one allreduce duration per bucket")
    ends, free_at = [], float("-inf")
    for r, d in zip(ready, durations):
        start = max(r, free_at)
        free_at = start + d
        ends.append(free_at)
    total = sum(durations)
    exposed = max(0.0, free_at - backward_end)
    overlap = (total - exposed) / total if total > 0 else 1.0
    return ends, exposed, overlap


def _bucket_variant(serialize: bool = True, clamp: bool = True, in_order: bool = True, wait_ready: bool = True,
                    hidden_share: bool = True, check_len: bool = True):
    """The model with the template's signature: right by default, with one typical mistake otherwise."""
    def bucket_overlap(ready, durations, backward_end):
        if check_len and len(ready) != len(durations):
            raise ValueError("one allreduce duration per bucket")
        ready, durations = ready[:len(durations)], durations[:len(ready)]     # what zip() does
        order = range(len(ready)) if in_order else sorted(range(len(ready)), key=lambda i: ready[i])
        ends, free_at = [0.0] * len(ready), float("-inf") if wait_ready else 0.0
        for i in order:
            start = (max(ready[i], free_at) if wait_ready else free_at) if serialize else ready[i]
            free_at = start + durations[i]
            ends[i] = free_at
        total = sum(durations)
        exposed = max(ends, default=backward_end) - backward_end
        exposed = max(0.0, exposed) if clamp else exposed
        share = (total - exposed) / total if hidden_share else exposed / total
        return ends, exposed, share
    return bucket_overlap


BUCKET_HINTS = {
    "serialize": "the allreduces run on one communication stream, one after the other: each starts at "
                 "max(its bucket's ready time, the end of the previous allreduce), not at its ready time",
    "in_order": "DDP launches the allreduces in bucket order: do not sort the buckets by ready time",
    "wait_ready": "an allreduce cannot start before its bucket is ready: start = max(ready, previous end)",
    "clamp": "the exposed time cannot be negative: when the last allreduce ends before the backward, it is 0",
    "hidden_share": "the overlap fraction is the hidden share of the communication, (total - exposed) / total",
}
BUCKET_VARIANTS = {k: _bucket_variant(**{k: False}) for k in BUCKET_HINTS}
ZIP_HINT = ("ready and durations of different lengths must raise ValueError; zip() stops at the shorter list "
            "and would drop a bucket silently")
BUCKET_MISTAKES = [(BUCKET_VARIANTS["serialize"], "one communication stream"), (BUCKET_VARIANTS["in_order"], "bucket order"),
                   (BUCKET_VARIANTS["wait_ready"], "before its bucket is ready"),
                   (BUCKET_VARIANTS["clamp"], "cannot be negative"), (BUCKET_VARIANTS["hidden_share"], "hidden share"),
                   (_bucket_variant(check_len=False), "raise ValueError")]


def _bucket_answers(fn):
    out = []
    for ready, durations, end in BUCKET_CASES:
        ends, exposed, share = fn(list(ready), list(durations), end)
        out.extend([*map(float, ends), float(exposed), float(share)])
    return out


@code_exercise("bucket_overlap", solution=my_bucket_overlap, mistakes=BUCKET_MISTAKES)
def check_bucket_overlap(fn, **_):
    """``fn(ready, durations, backward_end) -> (ends, exposed, overlap)`` on four cases, against the right
    model; then a call with one duration missing must raise ValueError."""
    got = _bucket_answers(fn)
    v = diagnose(got, _bucket_answers(_bucket_variant()),
                 {hint: _bucket_answers(BUCKET_VARIANTS[k]) for k, hint in BUCKET_HINTS.items()},
                 rtol=1e-9, atol=1e-12, what="[end of each allreduce..., exposed, overlap] over the four cases")
    if not v.ok:
        return v
    try:
        fn([1.0, 2.0, 3.0], [0.5, 0.5], 3.0)
    except ValueError:
        return Verdict(True)
    return Verdict(False, ZIP_HINT)
