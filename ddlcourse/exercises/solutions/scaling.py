"""Reference solutions of notebooks/13_scaling.ipynb: the speedup and efficiency table and the distributed step
timer as a learner writes them, and each with one typical mistake (what their checkers,
:mod:`ddlcourse.exercises.checkers.scaling`, must name)."""
import statistics

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: speedup and efficiency
def _scaling_variant(kind: str):
    def table(times):
        ns = sorted(times)
        base = ns[0]
        out = {}
        for n in ns:
            s = times[base] / times[n]
            if kind == "inverted":
                s = times[n] / times[base]
            e = s if kind == "no_divide" else s / (n if kind == "over_n" else n / base)
            out[n] = (s, e)
        return out
    return table


def my_strong_scaling(times):
    """The reference a learner would write: speedup and efficiency against the smallest rank count."""
    base = min(times)
    out = {}
    for n in sorted(times):
        speedup = times[base] / times[n]
        out[n] = (speedup, speedup / (n / base))
    return out


SCALING_VARIANTS = {kind: _scaling_variant(kind) for kind in ("inverted", "no_divide", "over_n")}

reference("strong_scaling", mistakes=[
    (SCALING_VARIANTS["inverted"], "upside down"), (SCALING_VARIANTS["no_divide"], "did not divide"),
    (SCALING_VARIANTS["over_n"], "not by N")])(my_strong_scaling)


# --------------------------------------------------------------------------- build it: a distributed step timer
def my_time_step(step, sync, clock, comm, warmup, repeats):
    """The reference a learner would write: the seconds of one step, the same on every rank."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = clock()
        step()
        sync()
        mine = clock() - t0
        times.append(max(comm.allgather(mine)))
    times.sort()
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def _timer_variant(combine: str = "max", warm: bool = True, sync_end: bool = True, sync_start: bool = True,
                   median: bool = True):
    """A step timer with the template's signature: right by default, with one typical mistake otherwise."""
    def time_step(step, sync, clock, comm, warmup, repeats):
        if warm:
            for _ in range(warmup):
                step()
            if sync_start:
                sync()
        times = []
        for _ in range(repeats):
            comm.Barrier()
            t0 = clock()
            step()
            if sync_end:
                sync()
            t = clock() - t0
            every = comm.allgather(t)
            times.append({"max": max(every), "own": t, "rank0": every[0],
                          "mean": sum(every) / len(every)}[combine])
        return statistics.median(times) if median else statistics.fmean(times)
    return time_step


TIMER_VARIANTS = {"own": _timer_variant(combine="own"), "rank0": _timer_variant(combine="rank0"),
                  "mean": _timer_variant(combine="mean"), "warm": _timer_variant(warm=False),
                  "sync_end": _timer_variant(sync_end=False), "sync_start": _timer_variant(sync_start=False),
                  "median": _timer_variant(median=False)}

reference("step_timer", mistakes=[
    (TIMER_VARIANTS["own"], "the ranks returned different times"), (TIMER_VARIANTS["rank0"], "rank 0's time"),
    (TIMER_VARIANTS["mean"], "averaged the time over the ranks"),
    (TIMER_VARIANTS["warm"], "warm-up steps are in your timing"),
    (TIMER_VARIANTS["sync_end"], "before the device finished"),
    (TIMER_VARIANTS["sync_start"], "after the warm-up"), (TIMER_VARIANTS["median"], "take the median")])(my_time_step)
