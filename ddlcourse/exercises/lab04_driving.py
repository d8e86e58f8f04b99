"""Exercises of labs/04_driving.ipynb."""
from ddlcourse.data.driving import CAR_L, quotas
from ddlcourse.selfcheck import exercise


@exercise("lab04_ttc", "the gap between bumpers is the centre distance minus one car length; divide by the closing speed")
def ttc(centre_gap: float, closing_speed: float) -> float:
    return (centre_gap - CAR_L) / closing_speed


@exercise("lab04_majority_macro_f1", "the majority class has recall 1 and precision = its share; the other "
          "classes score F1 = 0; macro-F1 averages the three")
def majority_macro_f1(n: int = 23) -> float:
    q = quotas(n)
    p = q[0] / n
    return (2 * p / (p + 1)) / 3


@exercise("lab04_bubble", "a pipeline of p stages and m micro-batches idles (p - 1) / (m + p - 1) of the time")
def bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)
