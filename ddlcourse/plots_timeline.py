"""Plots for the notebooks on memory, model, pipeline, tensor and spatial parallelism, federated learning, and the labs: per-rank timelines, the pipeline bubble, memory bars, accuracy curves."""
from __future__ import annotations

import matplotlib.pyplot as plt

# F forward, B backward (the input gradient alone in a zero-bubble schedule), W weight gradient, H the head
COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "H": "#C44E52"}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight grad", "H": "head"}
_KEYS = ("rank", "kind", "micro_batch", "start", "stop")


def as_event(e) -> dict:
    """One timeline event as a dict ``{rank, kind, micro_batch, start, stop}`` (times in seconds).

    Accepts the dicts of :class:`ddlcourse.parallel.model_parallel.Timeline` and the tuples
    ``(rank, kind, micro_batch, start, stop)`` of the labs.
    """
    if isinstance(e, dict):
        return {k: e[k] for k in _KEYS}
    if len(e) != 5:
        raise ValueError(f"a timeline event is (rank, kind, micro_batch, start, stop), got {e!r}")
    return dict(zip(_KEYS, e))


def relative_events(events, t0: float) -> list[dict]:
    """Events as dicts with their times counted from ``t0`` (e.g. the start of the step)."""
    out = []
    for e in map(as_event, events):
        out.append({**e, "start": e["start"] - t0, "stop": e["stop"] - t0})
    return out


def gather_events(events, comm) -> list[dict]:
    """Every rank's events on every rank (mpi4py ``allgather`` over ``comm``), as dicts, sorted by rank and time."""
    mine = [as_event(e) for e in events]
    parts = comm.allgather(mine) if comm is not None else [mine]
    return sorted((e for part in parts for e in part), key=lambda e: (e["rank"], e["start"]))


def plot_timeline(events, ax=None, title: str = "", label_micro_batches: bool = True):
    """One row per rank; a box per event, coloured by kind (F forward, B backward, W weight grad, H head), in ms.

    The one timeline of the course: model parallelism (15), pipelines (16), torch's schedules (17), lab 4 and the
    profiles of 24 draw with it.

    ``events``: dicts ``{rank, kind, micro_batch, start, stop}`` or tuples in that order (seconds).
    Boxes are labelled with the micro-batch number; the legend lists the kinds present.
    """
    events = [as_event(e) for e in events]
    ranks = sorted({e["rank"] for e in events})
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.45 * (1 + len(ranks))))
    for e in events:
        y = e["rank"]
        w = e["stop"] - e["start"]
        ax.barh(y, w * 1e3, left=e["start"] * 1e3, color=COLORS.get(e["kind"], "grey"), edgecolor="white", height=0.8)
        if label_micro_batches:
            ax.text((e["start"] + w / 2) * 1e3, y, str(e["micro_batch"]), ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=10)
    kinds = [k for k in COLORS if any(e["kind"] == k for e in events)] or list(KIND_NAMES)[:2]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds],
              labels=[KIND_NAMES[k] for k in kinds], loc="lower right", fontsize=7)
    return ax


def plot_bubble(rows_by_schedule: dict, ax=None):
    """Measured bubble fraction against micro-batches per schedule, with (p-1)/(m+p-1)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3))
    for name, rows in rows_by_schedule.items():
        ax.plot([r["m"] for r in rows], [r["measured"] for r in rows], "o-", label=f"measured, {name}")
    rows = next(iter(rows_by_schedule.values()))
    ax.plot([r["m"] for r in rows], [r["predicted"] for r in rows], "k--", label="(p-1)/(m+p-1)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return ax


def plot_memory_bars(parts_by_label: dict, keys=("params", "grads", "optimizer", "activations"), ax=None,
                     unit: float = 2**20, unit_name: str = "MiB"):
    """Stacked bars: one bar per label (e.g. predicted/measured, or ddp/zero1/...), one colour per part."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    labels = list(parts_by_label)
    bottom = [0.0] * len(labels)
    for k in keys:
        vals = [parts_by_label[l].get(k, 0) / unit for l in labels]
        ax.bar(labels, vals, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel(unit_name)
    ax.legend(fontsize=7)
    return ax


def plot_curves(curves: dict, ax=None, xlabel: str = "round", ylabel: str = "test accuracy"):
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return ax
