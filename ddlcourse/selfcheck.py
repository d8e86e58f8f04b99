"""Self-checks for the exercises at the end of each notebook.

A check compares a learner's answer with a reference computed here (never stored as a bare literal
in the notebook) and prints a verdict with a hint, in the spirit of karpathy's ``cmp``::

    from ddlcourse.selfcheck import check
    check("allreduce_sum", my_answer, n_ranks=4)

Each notebook's reference answers live in ``ddlcourse/exercises/nbNN_topic.py`` (one file per notebook),
registered with the ``@exercise`` decorator; every module of that package is imported on first use.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

# name -> (reference(**kwargs) -> answer, hint)
EXERCISES: dict[str, tuple[Callable, str]] = {}


def exercise(name: str, hint: str):
    """Register ``fn`` as the reference answer of exercise ``name``."""
    def deco(fn):
        if name in EXERCISES and EXERCISES[name][0].__module__ != fn.__module__:
            raise ValueError(f"exercise {name!r} is defined twice ({EXERCISES[name][0].__module__} and {fn.__module__})")
        EXERCISES[name] = (fn, hint)
        return fn
    return deco


def _close(a, b, rtol, atol) -> bool:
    try:
        return bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol, atol=atol))
    except (TypeError, ValueError):
        return a == b


def check(name: str, answer, rtol: float = 1e-4, atol: float = 1e-8, **kwargs) -> bool:
    """Print whether ``answer`` is right for exercise ``name`` and return it as a bool."""
    _load_all()
    if name not in EXERCISES:
        raise KeyError(f"no exercise {name!r}; known: {', '.join(sorted(EXERCISES))}")
    ref, hint = EXERCISES[name]
    if answer is None or answer is Ellipsis:
        print(f"[{name}] not answered yet. Hint: {hint}")
        return False
    ok = _close(answer, ref(**kwargs), rtol, atol)
    print(f"[{name}] {'correct' if ok else 'not quite'}" + ("" if ok else f". Hint: {hint}"))
    return ok


def _load_all():
    """Import every module of ``ddlcourse.exercises`` (each registers its notebook's answers)."""
    import importlib
    import pkgutil

    import ddlcourse.exercises as pkg
    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")
