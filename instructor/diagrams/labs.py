"""Diagrams of the four labs: where each lab's data, model and ranks go (data parallelism with SyncBatchNorm,
a 3-D volume split into depth slabs, SIMP problems solved on the engines, camera views on their own ranks)."""
from __future__ import annotations

from instructor.diagrams import PHASE_COLORS, RANK_COLORS, arrow, box, canvas, diagram


@diagram
def maize_layout(ranks=4):
    """Lab 1: each rank its chunks of tiles and a U-Net replica; SyncBatchNorm and the gradients allreduced."""
    fig, ax = canvas(8, 3.6)
    w = 7.4 / ranks
    for r in range(ranks):
        x = 0.3 + r * w
        box(ax, x, 2.4, w * 0.85, 0.7, f"tiles: chunk {r}", color="#DDDDDD", fontsize=8)
        box(ax, x, 1.3, w * 0.85, 0.9, f"rank {r}\nU-Net + AE\nreplica", color=RANK_COLORS[r], textcolor="white",
            fontsize=8)
        arrow(ax, x + w * 0.42, 2.4, x + w * 0.42, 2.2)
    box(ax, 0.3, 0.4, 7.4 - 0.15 * w, 0.6, "allreduce: BatchNorm statistics (SyncBatchNorm, every layer) and "
        "gradients (once a step)", color=PHASE_COLORS["H"], fontsize=8)
    for r in range(ranks):
        arrow(ax, 0.3 + r * w + w * 0.42, 1.3, 0.3 + r * w + w * 0.42, 1.0, style="<->")
    ax.text(4, 3.35, "same global batch on 1, 2, 4 ranks → the serial run; metrics gathered over all ranks",
            ha="center", fontsize=9)
    return fig


@diagram
def seismic_layout(spatial=2):
    """Lab 2: one 3-D cube split into depth slabs, one per rank, a halo slice exchanged at each cut."""
    fig, ax = canvas(8, 3.6)
    h = 2.6 / spatial
    for r in range(spatial):
        y = 0.4 + (spatial - 1 - r) * h
        box(ax, 0.6, y, 2.4, h * 0.92, f"depth slab {r}\nrank {r}", color=RANK_COLORS[r], textcolor="white",
            fontsize=9)
        if r < spatial - 1:
            box(ax, 3.3, y - 0.15, 1.3, 0.3, "halo slice", color=PHASE_COLORS["H"], fontsize=8)
            arrow(ax, 3.0, y + 0.05, 3.3, y, style="<->")
    ax.text(5.9, 2.5, "3×3×3 conv: 1 slice\nfrom each neighbour\n(zeros at the top\nand bottom)", ha="center",
            fontsize=9)
    ax.text(5.9, 1.0, "activations per rank\n≈ 2/3 of serial at 2 slabs\n(halo-padded inputs)", ha="center",
            fontsize=9)
    ax.text(4, 0.1, "a cube too big for one rank's budget trains split over ranks; weight gradients summed over them",
            ha="center", fontsize=9)
    return fig


@diagram
def topology_layout(engines=4):
    """Lab 3: SIMP problems solved on the engines into shards, then a data-parallel U-Net trained on them."""
    fig, ax = canvas(8, 3.6)
    w = 3.2 / engines
    for e in range(engines):
        box(ax, 0.2 + e * w, 2.3, w * 0.9, 0.8, f"SIMP\nengine {e}", color=RANK_COLORS[e], textcolor="white",
            fontsize=7)
        arrow(ax, 0.2 + e * w + w * 0.45, 2.3, 1.8, 1.7)
    box(ax, 0.6, 1.0, 2.4, 0.7, "shards: inputs (5 channels)\n+ SIMP densities", color="#DDDDDD", fontsize=8)
    arrow(ax, 3.0, 1.35, 3.7, 1.35)
    box(ax, 3.7, 0.8, 2.2, 1.1, "U-Net, data-parallel\n(GroupNorm)\nSGD · Adam · LAMB · SOAP", color=RANK_COLORS[0],
        textcolor="white", fontsize=8)
    arrow(ax, 5.9, 1.35, 6.4, 1.35)
    box(ax, 6.4, 0.8, 1.5, 1.1, "re-solve FE:\ncompliance\nratio", color=PHASE_COLORS["H"], fontsize=8)
    ax.text(4.9, 2.6, "global batch grows with ranks:\nlarge-batch optimizers", ha="center", fontsize=9)
    ax.text(4, 0.2, "physics makes the labels; the metric is physics again", ha="center", fontsize=9)
    return fig


@diagram
def driving_layout(dp=1, mp=4, views=3):
    """Lab 4: a dp x mp mesh; within a replica each camera-view encoder on a rank, the fusion head on the last."""
    from ddlcourse.parallel.branches import placement

    fig, ax = canvas(8, 1.3 + 1.4 * dp)
    owners, head = placement(views, mp)
    names = ["front", "rear", "bird's-eye"][:views] + [f"view {v}" for v in range(3, views)]
    w = 7.4 / mp
    for d in range(dp):
        y = 0.4 + (dp - 1 - d) * 1.4
        for k in range(mp):
            parts = [names[v] for v, o in enumerate(owners) if o == k] + (["head"] if k == head else [])
            rank = d * mp + k
            box(ax, 0.3 + k * w, y, w * 0.9, 1.1, f"rank {rank}\n" + "\n".join(parts), color=RANK_COLORS[k],
                textcolor="white", fontsize=8)
        ax.text(0.2, y + 0.55, f"replica {d}", rotation=90, va="center", ha="right", fontsize=8)
    ax.text(4, 0.8 + 1.4 * dp, f"{dp} × {mp}: encoders → features → head (micro-batches pipeline them); "
            "gradients averaged over replicas", ha="center", fontsize=8)
    return fig
