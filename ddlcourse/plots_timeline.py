"""Plots for notebooks 09-13: per-rank timelines, the pipeline bubble, memory bars, accuracy curves."""
from __future__ import annotations

import matplotlib.pyplot as plt

COLORS = {"F": "#4C72B0", "B": "#DD8452"}


def plot_timeline(events: list[dict], ax=None, title: str = "", label_micro_batches: bool = True):
    """One row per rank; forward (blue) and backward (orange) boxes, labelled with the micro-batch number."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.45 * (1 + len({e["rank"] for e in events}))))
    ranks = sorted({e["rank"] for e in events})
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
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()], labels=["forward", "backward"],
              loc="lower right", fontsize=7)
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
