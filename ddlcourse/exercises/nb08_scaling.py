"""Exercises of notebooks/08_scaling.ipynb."""
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("amdahl_limit", "with N -> infinity only the serial fraction remains: S = 1/f")
def amdahl_limit(serial_fraction: float) -> float:
    return 1.0 / serial_fraction


@exercise("parallel_efficiency", "efficiency = speedup / (ratio of resources)")
def parallel_efficiency(throughput_1: float, throughput_n: float, n: int) -> float:
    return throughput_n / throughput_1 / n


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


@code_exercise("strong_scaling", distributed=False)
def check_strong_scaling(fn, **_) -> Verdict:
    """``fn(times) -> {N: (speedup, efficiency)}`` from ``times[N]``, the measured seconds per step of the same
    global batch on N ranks; the smallest N is the baseline. Against ``bench.scaling_table(times, "strong")``."""
    from ddlcourse import bench
    cases = [{1: 2.0, 2: 1.1, 4: 0.6, 8: 0.4}, {2: 1.5, 4: 0.8, 8: 0.45, 16: 0.3}]

    def flat(f):
        return [v for t in cases for n in sorted(t) for v in f(dict(t))[n]]

    ref = [v for t in cases for r in bench.scaling_table(dict(t), "strong") for v in (r.speedup, r.efficiency)]
    mistakes = {
        "your speedup is upside down: S(N) = T(baseline) / T(N), which grows as N grows": flat(_scaling_variant("inverted")),
        "efficiency is the speedup divided by the ratio of resources, S / (N / N_baseline); you did not divide":
            flat(_scaling_variant("no_divide")),
        "when the baseline is not 1 rank (here: 2), divide the speedup by N / N_baseline, not by N":
            flat(_scaling_variant("over_n")),
    }
    return diagnose(flat(fn), ref, mistakes, what="[speedup, efficiency] per rank count")
