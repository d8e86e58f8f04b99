"""Case studies: each module ``ddlcourse.cases.<case>`` provides its ``Config`` and ``train(cfg) -> result``.

A case is any module of this package whose name does not start with ``_`` (``maize``, ``seismic``, ``topology``,
``driving``). It keeps only its science; its config is made with ``<case>.Config.make(scale, **overrides)``
and its command line is the course's one, :mod:`ddlcourse.training.cli`::

    python -m ddlcourse run CASE [--scale S] [--backend B] [--fresh] [key=value ...]

Modules
-------
maize     lab 1: maize plant instance segmentation and anomaly detection; Horovod against DDP, SyncBatchNorm
seismic   lab 2: 3-D seismic facies; 2-D sections against 3-D cubes past one rank's memory, halo exchange
topology  lab 3: a U-Net surrogate of topology optimisation; large batches with several optimizers
driving   lab 4: traffic conflicts from multi-camera clips; the views on their own ranks (a dp x mp grid)
"""
from __future__ import annotations

import importlib
import pkgutil


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


class CaseError(ValueError):
    """A case that does not exist."""


def get_case(name: str):
    """The module of case ``name``; a :class:`CaseError` that lists the cases if there is none."""
    if name not in available():
        known = ", ".join(available()) or "(none yet)"
        raise CaseError(f"unknown case {name!r}; available cases: {known}")
    return importlib.import_module(f"{__name__}.{name}")
