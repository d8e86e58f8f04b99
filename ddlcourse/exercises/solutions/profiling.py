"""Reference solutions of notebooks/24_profiling.ipynb: the exposed communication, the straggler and DDP's buckets on
one stream, and each with typical mistakes (what :mod:`ddlcourse.exercises.checkers.profiling` must name)."""
from ddlcourse import profiling
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the exposed communication
def _all_comm(comm, compute):          # no overlap taken off: every allreduce counted in full
    return sum(b - a for a, b in comm)


def _union_only(comm, compute):        # overlaps between allreduces merged, but compute ignored
    return profiling.total(comm)


def _minus_compute_total(comm, compute):   # comm minus all compute time (not minus the overlap)
    return max(0.0, profiling.total(comm) - profiling.total(compute))


def _no_union(comm, compute):          # each allreduce minus compute, the two overlapping ones counted twice
    return sum(profiling.exposed_comm([c], compute) for c in comm)


EXPOSED_VARIANTS = {"all_comm": _all_comm, "union_only": _union_only, "minus_compute_total": _minus_compute_total,
                    "no_union": _no_union}


@reference("exposed_comm", mistakes=[
    (_all_comm, "without taking off the part hidden"), (_union_only, "subtract the union of the compute"),
    (_minus_compute_total, "subtracted all compute time"), (_no_union, "merge the communication intervals")])
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


# --------------------------------------------------------------------------- the straggler
def _straggler_longest(waits):
    items = waits.items() if isinstance(waits, dict) else enumerate(waits)
    return max(items, key=lambda kv: kv[1])[0]


def _straggler_wait(waits):
    return min(waits.values() if isinstance(waits, dict) else waits)


def _straggler_position(waits):
    values = list(waits.values()) if isinstance(waits, dict) else list(waits)
    return values.index(min(values))


STRAGGLER_VARIANTS = {"longest": _straggler_longest, "wait": _straggler_wait, "position": _straggler_position}


@reference("find_straggler", mistakes=[
    (_straggler_longest, "waits longest"), (_straggler_wait, "not its rank"), (_straggler_position, "position")])
def my_find_straggler(waits):
    """The reference a learner would write: the rank with the shortest wait."""
    items = waits.items() if isinstance(waits, dict) else enumerate(waits)
    return min(items, key=lambda kv: kv[1])[0]


# --------------------------------------------------------------------------- build it: DDP's buckets on one stream
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


BUCKET_MODEL = _bucket_variant()        # right: what the checker compares with
BUCKET_VARIANTS = {k: _bucket_variant(**{k: False}) for k in ("serialize", "in_order", "wait_ready", "clamp",
                                                               "hidden_share")}
reference("bucket_overlap", mistakes=[
    (BUCKET_VARIANTS["serialize"], "one communication stream"), (BUCKET_VARIANTS["in_order"], "bucket order"),
    (BUCKET_VARIANTS["wait_ready"], "before its bucket is ready"), (BUCKET_VARIANTS["clamp"], "cannot be negative"),
    (BUCKET_VARIANTS["hidden_share"], "hidden share"), (_bucket_variant(check_len=False), "raise ValueError")],
)(my_bucket_overlap)
