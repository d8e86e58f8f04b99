"""Case studies: each module ``ddlcourse.cases.<case>`` provides ``train(cfg) -> result``.

``python -m ddlcourse run <case>`` dispatches here. A case is any module of this package that defines
``train`` and ``cli``; its name is the module name (``maize``, ``seismic``, ``topology``, ``driving``).
"""
from __future__ import annotations

import importlib
import pkgutil


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


BACKENDS = ("ddp", "horovod")


class CaseError(ValueError):
    """Unknown case, backend or bad configuration."""


def get_case(name: str):
    if name not in available():
        known = ", ".join(available()) or "(none yet)"
        raise CaseError(f"unknown case {name!r}; available cases: {known}")
    return importlib.import_module(f"{__name__}.{name}")


def main(name: str, argv: list[str], scale: str | None = None, backend: str = "ddp") -> int:
    """Command-line entry of ``python -m ddlcourse run``: parse the case's own options and train."""
    from ddlcourse import config
    if backend not in BACKENDS:
        raise CaseError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    config.get_scale(scale)  # validates
    mod = get_case(name)
    return mod.cli(argv, scale=scale, backend=backend)
