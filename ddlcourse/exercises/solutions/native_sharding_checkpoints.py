"""Reference solutions of notebooks/26_native_sharding_checkpoints.ipynb: which rows of a parameter a rank holds, and
resharding a row-sharded checkpoint by hand; each with typical mistakes (what
:mod:`ddlcourse.exercises.checkers.native_sharding_checkpoints` must name)."""
import math

from ddlcourse import dcp
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the rows a rank holds
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


SHARD_VARIANTS = {"floor": _floor, "remainder_to_last": _remainder_to_last, "array_split": _array_split,
                  "unclamped": _unclamped}


@reference("shard_range", mistakes=[
    (_floor, "use ceil(n / ranks)"),
    (_remainder_to_last, "does not give the remainder to the last rank"),
    (_array_split, "that is numpy's array_split"),
    (_unclamped, "clamp start and stop"),
])
def shard_range(n_rows, n_ranks, rank):
    """Rows [start, stop) of a dim-0 shard held by `rank` of `n_ranks` (torch.chunk's rule, as FSDP2 uses)."""
    size = -(-n_rows // n_ranks)                    # ceil(n_rows / n_ranks) rows per rank
    start = min(rank * size, n_rows)                # the last ranks may start past the end: clamp
    return start, min(start + size, n_rows)


# --------------------------------------------------------------------------- build it: reshard a checkpoint by hand
def reshard_rows(paths, n_rows, rank, n_ranks):
    """The rows ``[start, stop)`` of a parameter that ``rank`` of ``n_ranks`` holds (torch.chunk's rule), read from
    the old files ``paths``: old file i holds that rule's rows of ``len(paths)`` ranks as one tensor (rows_i, cols).
    Reads only the old files that hold some of the rows. Returns a tensor (stop - start, cols)."""
    import torch

    def rows_of(n, w, r):                           # torch.chunk's rule: ceil(n / w) rows each, the last ones less
        size = -(-n // w)
        return min(r * size, n), min(r * size + size, n)

    start, stop = rows_of(n_rows, n_ranks, rank)
    pieces = []
    for i, path in enumerate(paths):
        a, b = rows_of(n_rows, len(paths), i)       # the rows old file i holds
        lo, hi = max(start, a), min(stop, b)        # the part of them that is mine
        if lo < hi:
            pieces.append(torch.load(path)[lo - a:hi - a])
    return torch.cat(pieces)


def _rs_rows(rule, n, w, r):
    if rule == "array_split":
        q, extra = divmod(n, w)
        start = r * q + min(r, extra)
        return start, start + q + (r < extra)
    return dcp.shard_range(n, w, r)


def _reshard_variant(kind):
    """reshard_rows with one typical mistake: "inclusive" (one row too many from each file), "one_file" (new rank r
    reads old file r only), "array_split" (numpy's split rule, not the save's), "read_all" (every old file loaded)."""
    def reshard(paths, n_rows, rank, n_ranks):
        import torch
        rule = "array_split" if kind == "array_split" else "chunk"
        if kind == "one_file":
            return torch.load(paths[min(rank, len(paths) - 1)])
        start, stop = _rs_rows(rule, n_rows, n_ranks, rank)
        if kind == "read_all":
            return torch.cat([torch.load(p) for p in paths])[start:stop]
        pieces = []
        for i, path in enumerate(paths):
            a, b = _rs_rows(rule, n_rows, len(paths), i)
            lo, hi = max(start, a), min(stop, b)
            if lo < hi:
                pieces.append(torch.load(path)[lo - a:hi - a + (kind == "inclusive")])
        return torch.cat(pieces)
    reshard.__name__ = f"reshard_rows_{kind}"
    return reshard


RESHARD_VARIANTS = {kind: _reshard_variant(kind) for kind in ("inclusive", "one_file", "array_split", "read_all")}

reference("reshard_rows", mistakes=[
    (RESHARD_VARIANTS["inclusive"], "off by one"),
    (RESHARD_VARIANTS["one_file"], "one old file per new rank"),
    (RESHARD_VARIANTS["array_split"], "split rule"),
    (RESHARD_VARIANTS["read_all"], "only the old files"),
])(reshard_rows)
