"""Exercises of notebooks/08_scaling.ipynb."""
from ddlcourse.selfcheck import exercise


@exercise("amdahl_limit", "with N -> infinity only the serial fraction remains: S = 1/f")
def amdahl_limit(serial_fraction: float) -> float:
    return 1.0 / serial_fraction


@exercise("parallel_efficiency", "efficiency = speedup / (ratio of resources)")
def parallel_efficiency(throughput_1: float, throughput_n: float, n: int) -> float:
    return throughput_n / throughput_1 / n
