"""Bytes a rank sends, counted where the transformer-parallel schemes communicate (for ``ddlcourse.layout``).

Every communication of :mod:`~ddlcourse.parallel.sequence`, :mod:`~ddlcourse.parallel.context` and
:mod:`~ddlcourse.parallel.expert` calls :func:`add` with what *this rank* puts on the wire:

* point-to-point and all_to_all: exactly the bytes sent to other ranks;
* all-gather / reduce-scatter over ``n`` ranks: ``(n-1)/n`` of the full tensor (the ring algorithm);
* all-reduce: ``2 (n-1)/n`` of the tensor (a reduce-scatter, then an all-gather).

::

    with traffic.counting() as sent:
        loss = model(x).sum(); loss.backward()
    sent["all_to_all"]        # bytes this rank sent in all_to_all calls
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

_ACTIVE: list[Counter] = []


def add(kind: str, nbytes: float) -> None:
    for c in _ACTIVE:
        c[kind] += nbytes


def ring_bytes(kind: str, tensor_bytes: float, n: int) -> float:
    """Bytes one rank sends for a collective over ``n`` ranks on a tensor of ``tensor_bytes`` (full size)."""
    if n <= 1:
        return 0.0
    return {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}[kind] * (n - 1) / n * tensor_bytes


@contextmanager
def counting():
    """Count the bytes sent inside the block, by kind of communication (a ``Counter``)."""
    c = Counter()
    _ACTIVE.append(c)
    try:
        yield c
    finally:
        _ACTIVE.remove(c)
