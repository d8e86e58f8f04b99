"""Diagrams drawn for the talk decks (``![caption](diagram:NAME?k=v)`` in slides/talk/*.md).

A diagram is a function registered with ``@diagram``: it takes keyword arguments and returns a matplotlib
Figure (no files, no ``plt.show``). The build renders it to PNG. Every module of this package is imported
below, so a new module's diagrams are registered by existing. Modules draw with the shared helpers here
(``canvas``, ``box``, ``arrow``, the colours) so the decks look alike.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

DIAGRAMS: dict[str, Callable] = {}

# Okabe-Ito: distinguishable with the common colour-vision deficiencies. Rank i gets RANK_COLORS[i % 8].
RANK_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
# pipeline/timeline phases: forward, backward, weight-gradient (zero-bubble's W), halo/communication, idle
PHASE_COLORS = {"F": "#56B4E9", "B": "#E69F00", "W": "#009E73", "H": "#CC79A7", "idle": "#DDDDDD"}
INK = "#222222"


def diagram(fn: Callable) -> Callable:
    """Register ``fn`` under its own name (``diagram:NAME`` in a deck)."""
    if fn.__name__ in DIAGRAMS and DIAGRAMS[fn.__name__] is not fn:
        raise ValueError(f"diagram {fn.__name__!r} is registered twice ({DIAGRAMS[fn.__name__].__module__}, {fn.__module__})")
    DIAGRAMS[fn.__name__] = fn
    return fn


def canvas(width: float = 8, height: float = 4.5):
    """A figure in the course's style: white, no axes, equal aspect, data coordinates = inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), facecolor="white")
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.set_axis_off()
    return fig, ax


def box(ax, x, y, w, h, text="", color="#56B4E9", fontsize=11, textcolor=INK, alpha=1.0, edge=INK, **kw):
    """A rounded box with its lower-left corner at (x, y) and centred text; returns the patch."""
    from matplotlib.patches import FancyBboxPatch

    pad = min(w, h) * 0.08
    patch = FancyBboxPatch((x + pad, y + pad), w - 2 * pad, h - 2 * pad, boxstyle=f"round,pad={pad}",
                           facecolor=color, edgecolor=edge, linewidth=1.0, alpha=alpha)
    ax.add_patch(patch)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=textcolor, **kw)
    return patch


def arrow(ax, x0, y0, x1, y1, color=INK, style="->", lw=1.5, text="", fontsize=9, **kw):
    """An arrow from (x0, y0) to (x1, y1), with an optional label at its middle."""
    from matplotlib.patches import FancyArrowPatch

    a = FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=14, color=color, lw=lw,
                        shrinkA=2, shrinkB=2, **kw)
    ax.add_patch(a)
    if text:
        ax.text((x0 + x1) / 2, (y0 + y1) / 2, text, ha="center", va="bottom", fontsize=fontsize, color=color)
    return a


def chart_done(fig, ax):
    """Finish a plotted chart (not a canvas drawing): no top and right spines, a tight layout. Returns ``fig``."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def render(name: str, **kwargs):
    """The Figure of the registered diagram ``name`` drawn with ``kwargs``."""
    if name not in DIAGRAMS:
        raise KeyError(f"no diagram named {name!r}; registered: {', '.join(sorted(DIAGRAMS))}")
    fig = DIAGRAMS[name](**kwargs)
    if fig is None or not hasattr(fig, "savefig"):
        raise TypeError(f"diagram {name!r} must return a matplotlib Figure, got {type(fig).__name__}")
    return fig


for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
