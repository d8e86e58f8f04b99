"""Case studies: each module ``ddlcourse.cases.<case>`` provides its ``Config`` and ``train(cfg) -> result``.

A case is any module of this package whose name does not start with ``_`` (``maize``, ``seismic``, ``topology``,
``driving``). It keeps only its science; its config is made with ``<case>.Config.make(scale, **overrides)``
and its command line is the course's one, :mod:`ddlcourse.training.cli`::

    python -m ddlcourse run CASE [--scale S] [--backend B] [--fresh] [key=value ...]
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
