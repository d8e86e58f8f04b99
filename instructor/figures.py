"""Figures for the lectures (drawn, not downloaded)."""
from __future__ import annotations

# scheme -> (what is split across devices, what is communicated, when it pays off)
SCHEMES = [
    ("data", "the batch", "gradients (allreduce)", "the model fits; more samples/s"),
    ("sharded (ZeRO/FSDP)", "batch + optimizer state, grads, params", "reduce-scatter / allgather", "optimizer state does not fit"),
    ("layer (model)", "the layers", "activations (send/recv)", "the model does not fit"),
    ("pipeline", "layers + micro-batches", "activations per micro-batch", "deep models; hide the idle time"),
    ("tensor", "each layer's matrices", "partial sums (allreduce)", "single layers too large"),
    ("spatial", "the image / volume", "halos (neighbours)", "activations of one sample do not fit"),
    ("federated", "the data owners", "model updates, rarely", "data cannot move"),
]


def parallelism_map(ax=None):
    """A table-like map: rows are schemes, columns what is split / communicated / when."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 3.6))
    ax.set_axis_off()
    cols = ["scheme", "split across devices", "communicated", "use it when"]
    xs = [0.0, 0.2, 0.52, 0.77]
    colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#8C8C8C"]
    for x, c in zip(xs, cols):
        ax.text(x, 1.0, c, weight="bold", fontsize=9, va="bottom")
    for i, (row, color) in enumerate(zip(SCHEMES, colors)):
        y = 0.9 - i * 0.13
        ax.add_patch(plt.Rectangle((-0.01, y - 0.055), 0.19, 0.11, color=color, alpha=0.85))
        ax.text(xs[0], y, row[0], color="white", weight="bold", fontsize=8.5, va="center")
        for x, txt in zip(xs[1:], row[1:]):
            ax.text(x, y, txt, fontsize=8.5, va="center")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    return ax


def hpc_attributes(ax=None):
    """The four attributes of an HPC system for deep learning, as rough orders of magnitude."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.8))
    names = ["compute\n(TFLOP/s per GPU)", "memory\n(GB per GPU)", "interconnect\n(GB/s per node)", "storage\n(GB/s file system)"]
    laptop = [0.5, 16, 0, 2]
    node = [1000, 80, 100, 10]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], laptop, width=0.4, label="laptop CPU", color="#bbbbbb")
    ax.bar([i + 0.2 for i in x], node, width=0.4, label="GPU cluster node", color="#4C72B0")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.legend(fontsize=8)
    ax.set_title("orders of magnitude (typical 2024-2026 hardware)", fontsize=9)
    return ax
