"""Case studies: each module ``ddlcourse.cases.<case>`` provides ``train(cfg) -> result``.

``python -m ddlcourse run CASE [--scale S] [--backend ddp|horovod] [--fresh] [key=value ...]`` dispatches
here. A case is any module of this package that defines ``train`` and ``cli``; its name is the module name
(``maize``, ``seismic``, ``topology``, ``driving``). A case built on the shared skeleton
(:mod:`ddlcourse.training`) has ``cli = training.case_cli`` on itself, so every case takes the same options.
"""
from __future__ import annotations

import importlib
import pkgutil

from ddlcourse.training import BACKENDS


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


class CaseError(ValueError):
    """Unknown case, backend or bad configuration."""


def get_case(name: str):
    if name not in available():
        known = ", ".join(available()) or "(none yet)"
        raise CaseError(f"unknown case {name!r}; available cases: {known}")
    return importlib.import_module(f"{__name__}.{name}")


def main(name: str, argv: list[str], scale: str | None = None, backend: str | None = "ddp") -> int:
    """Command-line entry of ``python -m ddlcourse run``: check case, scale and backend, then run the case's CLI."""
    from ddlcourse import config
    mod = get_case(name)
    if backend is not None and backend not in BACKENDS:
        raise CaseError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    config.get_scale(scale)  # validates
    try:
        return mod.cli(argv, scale=scale, backend=backend)
    finally:
        from ddlcourse import dist
        dist.shutdown()      # destroy the process group (and Horovod) before the interpreter exits
