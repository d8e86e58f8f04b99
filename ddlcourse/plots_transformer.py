"""Plots of the transformer-parallelism notebooks (context and expert parallelism)."""
from __future__ import annotations

import numpy as np

from ddlcourse.parallel import context


def _plt():
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    return plt


def plot_causal_layout(seq_len: int, cp: int, ax=None, layouts=("contiguous", "zigzag")):
    """The causal attention matrix, each query row coloured by the rank that owns it (white: masked)."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(1, len(layouts), figsize=(3.2 * len(layouts), 3))
    ax = np.atleast_1d(ax)
    for a, layout in zip(ax, layouts):
        img = np.full((seq_len, seq_len), np.nan)
        for r in range(cp):
            for p in context.positions(r, cp, seq_len, layout).tolist():
                img[p, :p + 1] = r
        a.imshow(img, cmap="tab10", vmin=0, vmax=9, interpolation="nearest")
        a.set_title(f"{layout}: rows by rank")
        a.set_xlabel("key position")
        a.set_ylabel("query position")
    return ax


def plot_work_per_rank(per_layout: dict, ylabel: str = "attention scores computed", ax=None):
    """Grouped bars: one value per rank for each layout (``{layout: [v_rank0, v_rank1, ...]}``)."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3))
    n = len(next(iter(per_layout.values())))
    w = 0.8 / len(per_layout)
    for i, (name, vals) in enumerate(per_layout.items()):
        ax.bar(np.arange(n) + i * w, vals, width=w, label=name)
    ax.set_xticks(np.arange(n) + w * (len(per_layout) - 1) / 2, [f"rank {r}" for r in range(n)])
    ax.set_ylabel(ylabel)
    ax.legend()
    return ax


def plot_losses(curves: dict, chance: float | None = None, ax=None):
    """Loss curves ``{label: [loss per step]}``, with the chance level as a dashed line."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3))
    for i, (name, losses) in enumerate(curves.items()):
        ax.plot(losses, label=name, ls="-" if i == 0 else "--", lw=2 if i == 0 else 1.2)
    if chance is not None:
        ax.axhline(chance, color="grey", ls=":", label="chance")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.legend()
    return ax


def plot_expert_load(sweep: list[dict], ax=None):
    """Left: tokens per expert at each capacity factor (and the capacity); right: share of dropped choices."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(9, 3))
    n_e = len(sweep[0]["load"])
    w = 0.8 / len(sweep)
    for i, s in enumerate(sweep):
        bars = ax[0].bar(np.arange(n_e) + i * w, s["load"], width=w, label=f"cf {s['capacity_factor']}")
        ax[0].hlines(s["capacity"], -0.4, n_e, colors=bars[0].get_facecolor(), linestyles=":")
    ax[0].set_xlabel("expert")
    ax[0].set_ylabel("tokens kept (dotted: capacity)")
    ax[0].legend(fontsize=7)
    ax[1].plot([s["capacity_factor"] for s in sweep], [100 * s["dropped_share"] for s in sweep], "o-")
    ax[1].set_xlabel("capacity factor")
    ax[1].set_ylabel("dropped choices (%)")
    return ax


def plot_activation_memory(rows: list[dict], ax=None):
    """Activation bytes of one block per rank, measured (bars) and predicted by the layout calculator (dots),
    for each ``(tp, sp)`` in ``rows`` (dicts with ``tp``, ``sp``, ``saved`` and ``predicted``)."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    labels = [f"tp={r['tp']}" + (" + sp" if r["sp"] else "") for r in rows]
    x = np.arange(len(rows))
    ax.bar(x, [r["saved"] / 1024 for r in rows], color=["C1" if r["sp"] else "C0" for r in rows],
           label="measured (autograd's saved tensors)")
    ax.plot(x, [r["predicted"] / 1024 for r in rows], "k_", ms=22, mew=2, ls="none", label="layout calculator")
    ax.set_xticks(x, labels)
    ax.set_ylabel("activation KiB per rank, one block")
    ax.legend(fontsize=8)
    return ax


def plot_layouts(entries: list[dict], memory_limit: float | None = None, ax=None):
    """Left: memory per rank (params, grads, optimizer, activations stacked) per layout; right: bytes one rank
    sends per step, inside a node (tp) and between nodes (dp, pp, cp, ep). ``entries``: dicts with ``label``,
    ``memory`` (:func:`ddlcourse.layout.memory_per_rank`) and ``comm`` (:func:`ddlcourse.layout.comm_per_step`)."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    x = np.arange(len(entries))
    bottom = np.zeros(len(entries))
    for part in ("params", "grads", "optimizer", "activations"):
        v = np.array([e["memory"][part] / 1e9 for e in entries])
        ax[0].bar(x, v, bottom=bottom, label=part)
        bottom += v
    if memory_limit:
        ax[0].axhline(memory_limit / 1e9, color="k", ls="--", lw=1, label="GPU memory")
    ax[0].set_ylabel("GB per rank")
    ax[0].legend(fontsize=7)
    intra = np.array([e["comm"]["tp"] / 1e9 for e in entries])
    inter = np.array([(e["comm"]["dp"] + e["comm"]["pp"] + e["comm"]["cp"] + e["comm"]["ep"]) / 1e9 for e in entries])
    ax[1].bar(x - 0.2, intra, width=0.4, label="inside a node (tp)")
    ax[1].bar(x + 0.2, inter, width=0.4, label="between nodes (dp, pp, cp)")
    ax[1].set_ylabel("GB sent per rank and step")
    ax[1].legend(fontsize=7)
    for a in ax:
        a.set_xticks(x, [e["label"] for e in entries], rotation=30, ha="right", fontsize=7)
    return ax
