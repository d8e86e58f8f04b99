"""Exercises of notebooks/11_pipeline.ipynb."""
from ddlcourse.selfcheck import Verdict, code_exercise, exercise, order_verdict


@exercise("bubble_fraction", "(p - 1) / (m + p - 1)")
def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


@exercise("min_micro_batches", "solve (p - 1) / (m + p - 1) <= b for m and round up")
def min_micro_batches(num_stages: int, max_bubble: float) -> int:
    m = 1
    while (num_stages - 1) / (m + num_stages - 1) > max_bubble + 1e-12:
        m += 1
    return m


# --------------------------------------------------------------------------- coding exercise: the 1F1B order
def _order_variant(kind: str):
    """Typical wrong 1F1B orders ``(stage, num_stages, m) -> [("F", i) | ("B", i), ...]``."""
    def order(stage, num_stages, m):
        if kind == "gpipe":                                   # all forwards, then all backwards
            return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        warmup = {"one_too_many": num_stages - stage, "reversed": stage}[kind]
        warmup = min(warmup, m)
        out = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            out += [("F", warmup + i), ("B", i)]
        return out + [("B", i) for i in range(m - warmup, m)]
    return order


def _as_ops(order) -> list[str]:
    return [f"{k}{int(i)}" for k, i in order]


@code_exercise("one_f_one_b", distributed=False)
def check_one_f_one_b(fn, **_) -> Verdict:
    """``fn(stage, num_stages, num_micro_batches) -> [("F", i) | ("B", i), ...]``: the 1F1B order of one stage,
    against ``pipeline.schedule_order("1f1b", ...)``, for several stages, stage counts and micro-batch counts
    (including fewer micro-batches than stages)."""
    from ddlcourse.parallel.pipeline import schedule_order
    cases = [(s, p, m) for p, m in ((4, 8), (4, 2), (2, 5), (3, 3)) for s in range(p)]
    hints = {
        "gpipe": "that is GPipe's order (all forwards, then all backwards): in 1F1B a stage starts its first "
                 "backward as soon as the warm-up forwards are done, then alternates one forward, one backward",
        "one_too_many": "too many warm-up forwards: stage s runs p - s - 1 of them (the last stage none), "
                        "not p - s",
        "reversed": "the warm-up is reversed: the first stage runs the most warm-up forwards (p - s - 1 for "
                    "stage s), the last stage none",
    }
    for s, p, m in cases:
        verdict = order_verdict(_as_ops(fn(s, p, m)), _as_ops(schedule_order("1f1b", s, p, m)),
                                f"stage {s} of {p}, {m} micro-batches",
                                [(_as_ops(_order_variant(kind)(s, p, m)), hint) for kind, hint in hints.items()],
                                "every micro-batch needs exactly one F and one B")
        if verdict is not None:
            return verdict
    return Verdict(True)
