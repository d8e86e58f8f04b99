"""Checkers of notebooks/13_scaling.ipynb: the reference answers of its questions, and the checkers of the speedup
and efficiency table and of the distributed step timer (on a fake asynchronous device) the learner writes."""
from ddlcourse import bench
from ddlcourse.exercises.solutions.scaling import SCALING_VARIANTS, TIMER_VARIANTS, _timer_variant
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise, told


@exercise("amdahl_limit", "with N -> infinity only the serial fraction remains: S = 1/f")
def amdahl_limit(serial_fraction: float) -> float:
    return 1.0 / serial_fraction


@exercise("parallel_efficiency", "efficiency = speedup / (ratio of resources)")
def parallel_efficiency(throughput_1: float, throughput_n: float, n: int) -> float:
    return throughput_n / throughput_1 / n


# --------------------------------------------------------------------------- coding exercise: speedup and efficiency
SCALING_HINTS = {
    "inverted": "your speedup is upside down: S(N) = T(baseline) / T(N), which grows as N grows",
    "no_divide": "efficiency is the speedup divided by the ratio of resources, S / (N / N_baseline); you did not "
                 "divide",
    "over_n": "when the baseline is not 1 rank (here: 2), divide the speedup by N / N_baseline, not by N",
}


@code_exercise("strong_scaling", distributed=False)
def check_strong_scaling(fn, **_) -> Verdict:
    """``fn(times) -> {N: (speedup, efficiency)}`` from ``times[N]``, the measured seconds per step of the same
    global batch on N ranks; the smallest N is the baseline. Against ``bench.scaling_table(times, "strong")``."""
    cases = [{1: 2.0, 2: 1.1, 4: 0.6, 8: 0.4}, {2: 1.5, 4: 0.8, 8: 0.45, 16: 0.3}]

    def flat(f):
        return [v for t in cases for n in sorted(t) for v in f(dict(t))[n]]

    ref = [v for t in cases for r in bench.scaling_table(dict(t), "strong") for v in (r.speedup, r.efficiency)]
    mistakes = {hint: flat(SCALING_VARIANTS[kind]) for kind, hint in SCALING_HINTS.items()}
    return diagnose(flat(fn), ref, mistakes, what="[speedup, efficiency] per rank count")


# --------------------------------------------------------------------------- build it: a distributed step timer
class FakeDevice:
    """A device that runs its work asynchronously on a simulated clock, as a GPU does on a real one.

    ``step()`` queues the work of one step and returns at once (after 1 ms of host time); ``sync()`` waits until
    the queue is empty (``torch.cuda.synchronize``); ``clock()`` reads the simulated seconds. On rank r a step
    takes ``base + r * per_rank`` (rank 0 is the fastest), the first ``warmup`` calls ``warm_extra`` more
    (compilation, caches, allocator), and rank 0's second timed call ``outlier`` more (the OS took the core).
    """

    LAUNCH = 0.001

    def __init__(self, rank: int, warmup: int, base: float = 1.0, per_rank: float = 0.5, warm_extra: float = 2.0,
                 outlier: float = 20.0):
        self.rank, self.warmup, self.base, self.per_rank = rank, warmup, base, per_rank
        self.warm_extra, self.outlier = warm_extra, outlier
        self.calls, self.now, self.busy_until = 0, 0.0, 0.0

    def duration(self, k: int) -> float:
        d = self.base + self.rank * self.per_rank
        if k < self.warmup:
            d += self.warm_extra
        if self.rank == 0 and k == self.warmup + 1:
            d += self.outlier
        return d

    def step(self):
        self.now += self.LAUNCH
        self.busy_until = max(self.now, self.busy_until) + self.duration(self.calls)
        self.calls += 1

    def sync(self):
        self.now = max(self.now, self.busy_until)

    def clock(self) -> float:
        return self.now


TIMER_HINTS = {
    "own": "the ranks returned different times: a step lasts until the slowest rank is done, so every rank must "
           "return the max over ranks of each repetition's time (max(comm.allgather(t)))",
    "rank0": "you returned rank 0's time, the fastest rank here: a step lasts until the slowest rank is done, "
             "take the max over ranks",
    "mean": "you averaged the time over the ranks: a step lasts until the slowest rank is done, take the max "
            "over ranks",
    "warm": "the warm-up steps are in your timing: run `warmup` untimed steps first, then time `repeats` steps",
    "sync_end": "you read the clock before the device finished: step() only queues the work, call sync() "
                "before you read the clock",
    "sync_start": "your first timed step also waited for the warm-up's queued work: call sync() after the "
                  "warm-up, before you start the clock",
    "median": "you took the mean over repetitions, and one slow outlier pulls it up: take the median",
}
TIMER_WARMUP, TIMER_REPEATS = 3, 3


def _timed(fn, comm):
    dev = FakeDevice(comm.Get_rank(), TIMER_WARMUP)
    return float(fn(dev.step, dev.sync, dev.clock, comm, TIMER_WARMUP, TIMER_REPEATS))


@code_exercise("step_timer", distributed=True, ranks=(2, 3))
def check_step_timer(fn, **_) -> Verdict:
    """On every rank: ``fn(step, sync, clock, comm, warmup, repeats)`` times a fake asynchronous device on a
    simulated clock, where rank r's step takes 1 + 0.5 r seconds (the answer: the slowest rank's), the warm-up
    steps 2 s more and one repetition of rank 0 20 s more; the same verdict on every rank."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = MPI.COMM_WORLD
    ans, err = None, None
    try:
        ans = _timed(fn, comm)
    except Exception as e:       # noqa: BLE001 - said on every rank first, so no rank waits for ever
        err = e
    elsewhere = told(err)
    if elsewhere is not None:
        return elsewhere
    every = comm.allgather(ans)
    # bench.time_steps reads the real clock: the solutions module's right timer, on the same fake devices
    ref = _timed(_timer_variant(), comm)
    if max(every) - min(every) > 1e-9:
        return Verdict(False, TIMER_HINTS["own"] + f"; got {', '.join(f'{a:.3f}' for a in every)} s")
    mistakes = {TIMER_HINTS[k]: _timed(TIMER_VARIANTS[k], comm) for k in TIMER_HINTS if k != "own"}
    return diagnose(ans, ref, mistakes, rtol=1e-9, atol=1e-9, what="the step time (simulated seconds)")
