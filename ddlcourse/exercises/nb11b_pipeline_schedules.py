"""Exercises of notebooks/11b_pipeline_schedules.ipynb: the interleaved 1F1B order of one rank."""
from ddlcourse.parallel.schedules import interleaved_order
from ddlcourse.selfcheck import Verdict, code_exercise, order_verdict

CASES = [(r, p, m, v) for p, m, v in ((2, 4, 2), (4, 8, 2), (4, 4, 2), (3, 6, 3), (2, 2, 2)) for r in range(p)]


def _variant(rank, p, m, v, warmup=None, reverse_backward=True, gpipe=False):
    """The interleaved order with one thing changed (the typical mistakes of the exercise)."""
    total = v * m
    if gpipe:
        warmup = total
    elif warmup is None:
        warmup = (v - 1) * p + 2 * (p - 1 - rank)
    warmup = max(0, min(warmup, total))

    def nth(k, backward):
        chunk = (k // p) % v
        if backward and reverse_backward:
            chunk = v - 1 - chunk
        return rank + chunk * p, (k // (p * v)) * p + k % p

    order = [("F", *nth(k, False)) for k in range(warmup)]
    for k in range(warmup, total):
        order += [("F", *nth(k, False)), ("B", *nth(k - warmup, True))]
    return order + [("B", *nth(k, True)) for k in range(total - warmup, total)]


MISTAKES = {
    "gpipe": (dict(gpipe=True),
              "that runs every forward before the first backward (GPipe's order, or looped BFS): start the "
              "backwards after the warm-up, then alternate one forward and one backward"),
    "plain_1f1b_warmup": (dict(warmup="plain"),
                          "that is the warm-up of plain 1F1B (p - rank - 1): with v stages per rank the rank "
                          "first runs (v - 1) * p forwards to fill its later stages, plus 2 * (p - 1 - rank)"),
    "no_extra_rounds": (dict(warmup="no_rounds"),
                        "the warm-up misses the (v - 1) * p forwards that fill the rank's later stages before the "
                        "first backward can come back"),
    "off_by_one": (dict(warmup="plus_one"),
                   "one warm-up forward too many: (v - 1) * p + 2 * (p - 1 - rank), capped at v * m"),
    "same_direction": (dict(reverse_backward=False),
                       "the backwards visit the rank's stages in the forward direction: the gradient comes back "
                       "through the last stage first, so backwards start on stage rank + (v - 1) * p"),
}


def mistake(kind: str):
    """``fn(rank, p, m, v)`` making the mistake ``kind`` of :data:`MISTAKES` (for tests and demos)."""
    opts = dict(MISTAKES[kind][0])
    w = opts.pop("warmup", None)

    def fn(rank, p, m, v):
        warm = {None: None, "plain": p - rank - 1, "no_rounds": 2 * (p - 1 - rank),
                "plus_one": (v - 1) * p + 2 * (p - 1 - rank) + 1}[w]
        return _variant(rank, p, m, v, warmup=warm, **opts)
    return fn


def _as_ops(order) -> list[str]:
    return [f"{str(k).upper()}{int(s)}.{int(mb)}" for k, s, mb in order]


@code_exercise("interleaved_order")
def check_interleaved_order(fn, **_) -> Verdict:
    """``fn(rank, num_ranks, num_micro_batches, stages_per_rank) -> [("F" | "B", stage, micro_batch), ...]``
    against :func:`ddlcourse.parallel.schedules.interleaved_order` (the order of torch's
    ``ScheduleInterleaved1F1B``) for several ranks, rank counts, micro-batch counts and stages per rank."""
    for r, p, m, v in CASES:
        verdict = order_verdict(_as_ops(fn(r, p, m, v)), _as_ops(interleaved_order(r, p, m, v)),
                                f"rank {r} of {p}, {m} micro-batches, {v} stages per rank",
                                [(_as_ops(mistake(kind)(r, p, m, v)), hint) for kind, (_, hint) in MISTAKES.items()],
                                "each of the rank's stages needs one F and one B per micro-batch")
        if verdict is not None:
            return verdict
    return Verdict(True)
