"""Scale profiles: one place that decides how big every notebook and lab runs.

Three profiles share the same code path:

* ``smoke``   -- CI; every notebook finishes in seconds.
* ``laptop``  -- the default; minutes on a few CPU ranks.
* ``cluster`` -- a GPU allocation.

The profile comes from the environment variable ``DDLCOURSE_SCALE`` (default ``laptop``),
or is passed explicitly. Notebooks never hard-code a size: they ask for their section,

>>> from ddlcourse import config
>>> s = config.sizes("setup_check", scale="smoke")
>>> s.n_ranks
2

and get an attribute-style record of the sizes for that section at that scale.
Later notebooks and labs add their own section to ``PROFILES``.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

SCALES = ("smoke", "laptop", "cluster")
DEFAULT_SCALE = "laptop"
ENV_VAR = "DDLCOURSE_SCALE"

# section -> scale -> sizes. Keep the keys of one section identical across scales.
PROFILES: dict[str, dict[str, dict]] = {
    "setup_check": {
        "smoke": dict(n_ranks=2, vector_len=4),
        "laptop": dict(n_ranks=2, vector_len=4),
        "cluster": dict(n_ranks=8, vector_len=4),
    },

    # ---- notebooks 01-03 (issue 3): add sections below this line ----


    # ---- notebooks 04-08 (issue 4): add sections below this line ----


    # ---- notebooks 09-13 (issue 5): add sections below this line ----


    # ---- notebooks 14-15 (issue 12): add sections below this line ----


    # ---- notebook 16 perfmodel (issue 11): add sections below this line ----


    # ---- lab 01 maize (issue 6): add sections below this line ----


    # ---- lab 02 seismic (issue 7): add sections below this line ----


    # ---- lab 03 topology (issue 8): add sections below this line ----


    # ---- lab 04 driving (issue 9): add sections below this line ----

}


class ScaleError(ValueError):
    """An unknown scale profile or section."""


def get_scale(scale: str | None = None) -> str:
    """The active scale: the argument if given, else ``$DDLCOURSE_SCALE``, else ``laptop``."""
    name = scale if scale is not None else os.environ.get(ENV_VAR, DEFAULT_SCALE)
    name = name.strip().lower()
    if name not in SCALES:
        raise ScaleError(
            f"unknown scale {name!r} (from {'the argument' if scale is not None else '$' + ENV_VAR}); "
            f"choose one of {', '.join(SCALES)}"
        )
    return name


def sizes(section: str, scale: str | None = None, **overrides) -> SimpleNamespace:
    """The sizes of one notebook or lab (``section``) at a scale, with optional overrides."""
    if section not in PROFILES:
        raise ScaleError(f"no scale section {section!r}; known sections: {', '.join(sorted(PROFILES))}")
    values = dict(PROFILES[section][get_scale(scale)])
    unknown = set(overrides) - set(values)
    if unknown:
        raise ScaleError(f"section {section!r} has no size(s) {sorted(unknown)}; it has {sorted(values)}")
    values.update(overrides)
    return SimpleNamespace(scale=get_scale(scale), **values)


def check_profiles() -> None:
    """Every section defines every scale, with the same keys (used by the tests)."""
    for section, by_scale in PROFILES.items():
        if set(by_scale) != set(SCALES):
            raise ScaleError(f"section {section!r} defines scales {sorted(by_scale)}, expected {list(SCALES)}")
        keys = {s: set(v) for s, v in by_scale.items()}
        if len({frozenset(k) for k in keys.values()}) != 1:
            raise ScaleError(f"section {section!r} has different keys per scale: {keys}")
