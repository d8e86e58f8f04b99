"""Diagrams of the introduction, part 1 (SGD, batch size) and the scaling laws of part 2."""
from __future__ import annotations

import numpy as np

from instructor.diagrams import INK, RANK_COLORS, arrow, box, canvas, chart_done, diagram

# scheme -> (what is split across devices, what is communicated, when it pays off)
SCHEMES = [
    ("data", "the batch", "gradients (allreduce)", "the model fits; more samples/s"),
    ("sharded (ZeRO/FSDP)", "optimizer state, grads, params", "reduce-scatter / allgather", "training state does not fit"),
    ("pipeline", "layers + micro-batches", "activations (send/recv)", "deep models; hide the bubble"),
    ("tensor", "each layer's matrices", "partial sums (allreduce)", "single layers too large"),
    ("sequence / context", "the tokens", "K/V blocks, norms' tokens", "long sequences"),
    ("expert", "the experts of a MoE", "tokens (all_to_all)", "many experts, sparse use"),
    ("spatial", "the image / volume", "halos (neighbours)", "one sample's activations do not fit"),
    ("federated", "the data owners", "model updates, rarely", "data cannot move"),
]


@diagram
def parallelism_map():
    """What each scheme splits, what it sends, when to use it: the course's map."""
    fig, ax = canvas(11, 5.2)
    xs, cols = [0.1, 2.7, 5.6, 8.3], ["scheme", "split across devices", "communicated", "use it when"]
    for x, c in zip(xs, cols):
        ax.text(x, 4.85, c, weight="bold", fontsize=12, va="center", color=INK)
    for i, row in enumerate(SCHEMES):
        y = 4.3 - i * 0.56
        box(ax, 0.0, y - 0.25, 2.5, 0.5, row[0], color=RANK_COLORS[i % 8], fontsize=10.5,
            textcolor="white" if i in (0, 2, 3, 5, 7) else INK)
        for x, t in zip(xs[1:], row[1:]):
            ax.text(x, y, t, fontsize=10.5, va="center", color=INK)
    return fig


@diagram
def hpc_attributes():
    """The four attributes of an HPC system for deep learning: laptop against a GPU node, orders of magnitude."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.2), facecolor="white")
    ax = fig.add_subplot(111)
    names = ["compute\n(TFLOP/s per device)", "memory\n(GB per device)", "interconnect\n(GB/s per node)",
             "storage\n(GB/s, file system)"]
    laptop, node = [0.5, 16, 0.1, 2], [989, 80, 400, 100]
    x = np.arange(len(names))
    ax.bar(x - 0.2, laptop, 0.4, label="laptop CPU", color="#BBBBBB")
    ax.bar(x + 0.2, node, 0.4, label="GPU node (H100-class)", color=RANK_COLORS[0])
    ax.set_yscale("log")
    ax.set_xticks(x, names, fontsize=10)
    ax.legend(fontsize=10, frameon=False)
    ax.set_title("orders of magnitude, not benchmarks", fontsize=11)
    return chart_done(fig, ax)


@diagram
def global_batch_split(ranks=2, batch=8):
    """One global batch split over ranks: each rank's mean over its share, then the allreduce-average."""
    fig, ax = canvas(9, 4.2)
    w = 8.0 / batch
    ax.text(0.5, 3.85, f"one global batch of {batch} samples", fontsize=12, color=INK)
    share = [batch // ranks + (1 if r < batch % ranks else 0) for r in range(ranks)]
    i = 0
    for r, n in enumerate(share):
        for _ in range(n):
            box(ax, 0.5 + i * w, 2.9, w, 0.7, f"x{i}", color=RANK_COLORS[r % 8], fontsize=10,
                textcolor="white" if r % 8 in (0, 5, 7) else INK)
            i += 1
    x0 = 0.5
    for r, n in enumerate(share):
        xc = x0 + n * w / 2
        arrow(ax, xc, 2.85, xc, 2.15)
        box(ax, x0 + 0.1, 1.35, n * w - 0.2, 0.75, f"rank {r}: gradient of\nits share's summed loss",
            color=RANK_COLORS[r % 8], alpha=0.35, fontsize=10)
        arrow(ax, xc, 1.3, 4.5, 0.75)
        x0 += n * w
    box(ax, 1.5, 0.05, 6.0, 0.65, "allreduce-sum, divide by the global count M: the serial gradient",
        color="#EEEEEE", fontsize=11)
    return fig


@diagram
def lr_warmup(base_lr=0.1, k=8, warmup=5, epochs=30):
    """The linear scaling rule with gradual warmup: k times the batch, k times the lr, reached over a warmup."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), facecolor="white")
    ax = fig.add_subplot(111)
    t = np.linspace(0, epochs, 400)
    target = base_lr * k
    lin = np.where(t < warmup, base_lr + (target - base_lr) * t / warmup, target)
    decay = np.ones_like(t)      # the schedule's later decay is the same for every rule: left out
    ax.plot(t, lin * decay, color=RANK_COLORS[0], lw=2.5, label=f"linear rule: {k}x batch, {k}x lr, {warmup}-epoch warmup")
    ax.plot(t, np.full_like(t, target) * decay, color=RANK_COLORS[5], ls="--", lw=1.5, label="no warmup: full lr at step 0")
    ax.plot(t, base_lr * np.sqrt(k) * decay, color=RANK_COLORS[2], lw=1.5, label=f"square-root rule: {np.sqrt(k):.1f}x lr")
    ax.plot(t, base_lr * decay, color="#888888", lw=1.5, label="base lr (batch B0)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("learning rate")
    ax.legend(fontsize=9, frameon=False, loc="upper right")
    return chart_done(fig, ax)


@diagram
def strong_vs_weak(ranks=4):
    """Strong scaling splits a fixed global batch; weak scaling keeps each rank's batch and grows the global one."""
    fig, ax = canvas(10, 4.2)
    ax.text(0.2, 3.9, "strong scaling: global batch fixed", fontsize=12, weight="bold", color=INK)
    ax.text(5.3, 3.9, "weak scaling: per-rank batch fixed", fontsize=12, weight="bold", color=INK)
    box(ax, 0.2, 2.9, 4.4, 0.6, "1 rank: B", color=RANK_COLORS[0], textcolor="white")
    for r in range(ranks):
        box(ax, 0.2 + r * 4.4 / ranks, 1.9, 4.4 / ranks, 0.6, f"B/{ranks}", color=RANK_COLORS[r % 8], fontsize=10)
    ax.text(0.2, 1.3, f"{ranks} ranks: each step {ranks}x less work per rank\nbuys steps per second (Amdahl)",
            fontsize=10.5, va="top", color=INK)
    box(ax, 5.3, 2.9, 4.4 / ranks, 0.6, "b", color=RANK_COLORS[0], textcolor="white")
    for r in range(ranks):
        box(ax, 5.3 + r * 4.4 / ranks, 1.9, 4.4 / ranks, 0.6, "b", color=RANK_COLORS[r % 8], fontsize=10)
    ax.text(5.3, 1.3, f"{ranks} ranks: global batch {ranks}b\nbuys samples per second (Gustafson)",
            fontsize=10.5, va="top", color=INK)
    return fig


@diagram
def speedup_laws(serial_fraction=0.05, max_ranks=64):
    """Amdahl (fixed problem) and Gustafson (growing problem) against the ideal line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.2), facecolor="white")
    ax = fig.add_subplot(111)
    n = np.arange(1, max_ranks + 1)
    f = serial_fraction
    ax.plot(n, n, color="#888888", ls="--", label="ideal: S(N) = N")
    ax.plot(n, n - f * (n - 1), color=RANK_COLORS[2], lw=2.5, label=f"Gustafson, f = {f:g}: N - f(N-1)")
    ax.plot(n, 1 / (f + (1 - f) / n), color=RANK_COLORS[0], lw=2.5, label=f"Amdahl, f = {f:g}: at most 1/f = {1 / f:g}")
    ax.axhline(1 / f, color=RANK_COLORS[0], lw=0.8, ls=":")
    ax.set_xlabel("ranks N")
    ax.set_ylabel("speedup S(N)")
    ax.legend(fontsize=10, frameon=False, loc="upper left")
    return chart_done(fig, ax)


@diagram
def course_map():
    """The course's parts and what each adds, left to right."""
    fig, ax = canvas(11, 3.6)
    parts = [("1 · Foundations", "SGD, batch size\nnb 01-02"), ("2 · Data parallelism", "done right, runtimes,\nat scale: nb 03-13"),
             ("3 · Beyond memory", "ZeRO, pipeline,\ntensor, spatial: 14-19"), ("4 · Transformers", "sequence, context,\nexperts: 20-22"),
             ("5 · At scale", "precision, faults,\nI/O, sizing: 23-30"), ("Labs 1-4", "maize, seismic,\ntopology, driving")]
    for i, (h, t) in enumerate(parts):
        x = 0.1 + i * 1.83
        box(ax, x, 1.9, 1.7, 1.0, h, color=RANK_COLORS[i % 8], fontsize=10.5,
            textcolor="white" if i in (0, 5) else INK)
        ax.text(x + 0.85, 1.65, t, ha="center", va="top", fontsize=9.5, color=INK)
        if i < len(parts) - 1:
            arrow(ax, x + 1.7, 2.4, x + 1.83, 2.4)
    ax.text(5.5, 0.35, "every notebook: runs on a laptop at smoke scale, checks its own result against the serial one",
            ha="center", fontsize=10.5, color=INK, style="italic")
    return fig
