"""Exercises of notebooks/12e_native_sharding_checkpoints.ipynb: which rows of a parameter a rank holds."""
import math

from ddlcourse import dcp
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

# (rows, ranks): even splits, uneven ones, more ranks than rows
_CASES = [(64, 4), (10, 4), (10, 3), (3, 4), (7, 2), (1, 1), (0, 2), (9, 4)]


def _all(fn):
    return [tuple(int(v) for v in fn(n, w, r)) for n, w in _CASES for r in range(w)]


def _floor(n, w, r):
    size = n // w
    return r * size, (r + 1) * size


def _remainder_to_last(n, w, r):
    size = n // w
    return r * size, n if r == w - 1 else (r + 1) * size


def _array_split(n, w, r):
    q, extra = divmod(n, w)
    start = r * q + min(r, extra)
    return start, start + q + (r < extra)


def _unclamped(n, w, r):
    size = math.ceil(n / w)
    return r * size, (r + 1) * size


@code_exercise("shard_range")
def check_shard_range(fn) -> Verdict:
    """``fn(n_rows, n_ranks, rank) -> (start, stop)``: the rows of a dim-0 shard rank ``rank`` holds (torch.chunk)."""
    return diagnose(_all(fn), _all(dcp.shard_range), {
        "with floor(n / ranks) rows per rank the last rows belong to nobody: use ceil(n / ranks)": _all(_floor),
        "torch.chunk (and FSDP2) does not give the remainder to the last rank: every rank gets ceil(n / ranks) "
        "rows, the last ones what is left": _all(_remainder_to_last),
        "that is numpy's array_split (the first ranks get one row more); FSDP2 splits like torch.chunk: "
        "ceil(n / ranks) rows per rank": _all(_array_split),
        "clamp start and stop to n_rows: the last ranks may hold fewer rows, or none": _all(_unclamped),
    }, what="(start, stop) per rank and case")
