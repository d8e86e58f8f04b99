"""Timing training steps, and turning times into throughput, speedup and parallel efficiency.

Definitions used throughout the course (N = number of ranks, T(N) = time per step or per run):

* throughput          X(N) = samples / second, summed over all ranks
* strong scaling      fixed global problem:     speedup S(N) = T(1) / T(N),  efficiency E(N) = S(N) / N
* weak scaling        fixed problem per rank:   speedup S(N) = X(N) / X(1),  efficiency E(N) = S(N) / N

(For weak scaling T(N) should stay flat, so X grows with N; both forms give the same E.)
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from ddlcourse.device import now, synchronize


@dataclass
class StepTimes:
    """Wall-clock seconds of repeated calls, after warm-up."""

    times: list[float]
    samples_per_step: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    @property
    def throughput(self) -> float:
        """Samples per second at the median step time."""
        return self.samples_per_step / self.median if self.samples_per_step else float("nan")


def time_steps(step: Callable[[], object], n_steps: int = 10, warmup: int = 2,
               samples_per_step: int = 0, sync: Callable[[], object] | None = None,
               device=None) -> StepTimes:
    """Time ``n_steps`` calls of ``step`` after ``warmup`` untimed calls.

    Before each clock read the queued work of ``device`` is waited for (``torch.cuda.synchronize`` on a
    GPU, see :func:`ddlcourse.device.synchronize`), then ``sync`` is called (for example an MPI barrier, to
    time the slowest rank), so asynchronous work is counted.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")

    def settle():
        if device is not None:
            synchronize(device)
        if sync:
            sync()

    for _ in range(warmup):
        step()
    settle()
    times = []
    for _ in range(n_steps):
        t0 = now()                     # settled above: the device's queue is empty
        step()
        settle()
        times.append(now() - t0)
    return StepTimes(times, samples_per_step)


@dataclass
class ScalingPoint:
    ranks: int
    seconds: float          # time per step (strong) or per step per rank-share (weak)
    throughput: float       # samples / s, all ranks
    speedup: float
    efficiency: float


def scaling_table(points: dict[int, float], mode: str = "strong",
                  samples: dict[int, float] | float | None = None) -> list[ScalingPoint]:
    """Speedup and efficiency from measured times per step, keyed by number of ranks.

    ``points[N]`` is the time of one step on N ranks. ``samples`` is the samples per step: one number
    (strong scaling: the same global batch) or a dict per N (weak scaling: global batch grows with N).
    The smallest N is the baseline; if it is not 1, speedups are relative to it, and efficiency
    compares against ideal scaling from that baseline.
    """
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if not points:
        raise ValueError("no measurements")
    bad = {n: t for n, t in points.items() if not (n >= 1 and t > 0)}
    if bad:
        raise ValueError(f"ranks must be >= 1 and times > 0, got {bad}")
    ns = sorted(points)
    base = ns[0]
    if samples is None:
        samples = 1.0
    spp = {n: (samples[n] if isinstance(samples, dict) else samples) for n in ns}
    if mode == "weak" and not isinstance(samples, dict):
        spp = {n: samples * n / base for n in ns}  # per-rank batch fixed
    thr = {n: spp[n] / points[n] for n in ns}
    out = []
    for n in ns:
        s = points[base] / points[n] if mode == "strong" else thr[n] / thr[base]
        out.append(ScalingPoint(n, points[n], thr[n], s, s / (n / base)))
    return out


def format_table(rows: Iterable[ScalingPoint]) -> str:
    lines = [f"{'ranks':>5} {'s/step':>9} {'samples/s':>11} {'speedup':>8} {'efficiency':>10}"]
    for r in rows:
        lines.append(f"{r.ranks:>5} {r.seconds:>9.4f} {r.throughput:>11.1f} {r.speedup:>8.2f} {r.efficiency:>10.0%}")
    return "\n".join(lines)


def to_records(rows: Iterable[ScalingPoint]) -> list[dict]:
    return [asdict(r) for r in rows]


def plot_scaling(rows: list[ScalingPoint], title: str = "", ax=None, label: str = "measured"):
    """Speedup against ranks, with the ideal line; efficiency printed at each point."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.2))
    ns = [r.ranks for r in rows]
    base = ns[0]
    ax.plot(ns, [n / base for n in ns], "k--", lw=1, label="ideal")
    ax.plot(ns, [r.speedup for r in rows], "o-", label=label)
    for r in rows:
        ax.annotate(f"{r.efficiency:.0%}", (r.ranks, r.speedup), textcoords="offset points",
                    xytext=(4, -12), fontsize=8)
    ax.set_xlabel("ranks")
    ax.set_ylabel("speedup")
    ax.set_xticks(ns)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax
