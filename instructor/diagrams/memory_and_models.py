"""Diagrams of part 3 (notebooks 14-19): the training state, checkpointing, model and pipeline parallelism,
tensor and spatial splits, ZeRO's stages and the DP x TP x PP mesh."""
from __future__ import annotations

from instructor.diagrams import INK, PHASE_COLORS, RANK_COLORS, arrow, box, canvas, diagram

# colours of the four parts of the training state (the same in every memory diagram)
PART_COLORS = {"params": "#0072B2", "grads": "#E69F00", "optimizer": "#009E73", "activations": "#CC79A7"}

# bytes per parameter of the model states, per recipe:
#   fp32: parameters 4, gradients 4, Adam's two moments 8 (notebooks 14 and 19);
#   mixed: fp16 parameters 2, fp16 gradients 2, fp32 master copy + two moments 12 (Rajbhandari et al. 2020, sec. 3.1)
RECIPES = {"fp32": {"params": 4, "grads": 4, "optimizer": 8}, "mixed": {"params": 2, "grads": 2, "optimizer": 12}}
# what each stage shards over the N data-parallel ranks (Rajbhandari et al. 2020: P_os, P_os+g, P_os+g+p)
STAGES = {"DDP": (), "ZeRO-1": ("optimizer",), "ZeRO-2": ("optimizer", "grads"),
          "ZeRO-3 / FSDP": ("optimizer", "grads", "params")}


def zero_bytes_per_param(stage: str, ranks: int, recipe: str = "fp32") -> dict:
    """Bytes per parameter that one rank holds, per part, under ``stage`` (a key of STAGES)."""
    parts = RECIPES[recipe]
    return {k: v / ranks if k in STAGES[stage] else float(v) for k, v in parts.items()}


@diagram
def training_state(recipe="fp32", act=4.5):
    """The four parts of the training state as one stacked bar, in bytes per parameter (activations: a sketch)."""
    fig, ax = canvas(8, 3.2)
    parts = dict(RECIPES[recipe])
    x, unit = 0.6, 0.32                                   # inches per byte
    labels = {"params": "parameters", "grads": "gradients", "optimizer": "Adam state", "activations": "activations"}
    for k, v in parts.items():
        box(ax, x, 1.5, v * unit, 1.0, f"{labels[k]}\n{v} B/param", color=PART_COLORS[k], fontsize=10,
            textcolor="white")
        x += v * unit
    ax.text(0.6 + 8 * unit, 2.75, f"{sum(parts.values())} bytes per parameter ({recipe} Adam): fixed by the model",
            ha="center", fontsize=11, color=INK)
    box(ax, x + 0.1, 1.5, act * unit, 1.0, "activations\n∝ batch × input size", color=PART_COLORS["activations"],
        fontsize=10, textcolor="white", alpha=0.55)
    arrow(ax, x + 0.1, 1.2, x + 0.1 + act * unit, 1.2, text="", style="<->")
    ax.text(4, 0.75, "activations grow with the batch, an image's side², a volume's side³", ha="center", fontsize=10)
    return fig


@diagram
def zero_stages(ranks=4, recipe="fp32"):
    """Per-rank memory of DDP and ZeRO-1/2/3 as stacked bars of bytes per parameter (sharded parts hatched)."""
    fig, ax = canvas(8, 4.5)
    unit, w = 0.2, 1.3                                     # inches per byte, bar width
    for i, stage in enumerate(STAGES):
        x, y = 0.5 + i * 1.9, 0.7
        per = zero_bytes_per_param(stage, ranks, recipe)
        for k, v in per.items():
            h = v * unit
            p = box(ax, x, y, w, max(h, 0.02), "", color=PART_COLORS[k])
            if k in STAGES[stage]:
                p.set_hatch("///")
            if h > 0.3:
                ax.text(x + w / 2, y + h / 2, f"{k} {v:g}", ha="center", va="center", fontsize=8, color="white")
            y += h
        total = sum(per.values())
        ax.text(x + w / 2, y + 0.1, f"{total:g} B", ha="center", va="bottom", fontsize=11, color=INK)
        ax.text(x + w / 2, 0.4, stage, ha="center", fontsize=11, color=INK)
    formula = ("16 · 8+8/N · 4+12/N · 16/N" if recipe == "fp32" else "16 · 4+12/N · 2+14/N · 16/N")
    ax.text(4, 0.08, f"bytes/param/rank, {recipe} Adam, N = {ranks}: {formula}   (hatched: split over N)",
            ha="center", fontsize=9, color=INK)
    return fig


@diagram
def activation_checkpointing(layers=8, segments=3):
    """Layers in checkpointed chunks: only each chunk's input is kept; backward recomputes the chunk."""
    fig, ax = canvas(8, 3.0)
    w = 7.2 / layers
    bounds = [k * layers // segments for k in range(segments + 1)]
    for i in range(layers):
        chunk = max(k for k in range(segments) if bounds[k] <= i)
        box(ax, 0.4 + i * w, 1.3, w, 0.8, f"L{i}", color=RANK_COLORS[chunk % 8], textcolor="white", fontsize=10)
    for k in range(segments):
        x = 0.4 + bounds[k] * w
        box(ax, x - 0.15, 2.25, 0.5, 0.45, "kept", color=PART_COLORS["activations"], fontsize=8, textcolor="white")
        xs = 0.4 + bounds[k + 1] * w - 0.1
        arrow(ax, xs, 1.15, x + 0.1, 1.15, color=PHASE_COLORS["B"], text="recompute in backward", fontsize=7,
              connectionstyle="arc3,rad=0.25")
    ax.text(4, 0.35, f"{layers} layers, {segments} chunks: keep {segments} inputs, not {layers} outputs; "
            "cost ≈ one extra forward", ha="center", fontsize=10)
    return fig


@diagram
def model_parallel_stages(ranks=4):
    """Naive model parallelism: contiguous layers per rank; activations go forward, gradients come back."""
    fig, ax = canvas(8, 2.8)
    w = 7.0 / ranks
    for r in range(ranks):
        box(ax, 0.5 + r * w, 1.1, w - 0.35, 0.9, f"rank {r}\nstage {r}", color=RANK_COLORS[r], textcolor="white")
        if r < ranks - 1:
            x0 = 0.5 + (r + 1) * w - 0.35
            arrow(ax, x0, 1.75, x0 + 0.35, 1.75, color=PHASE_COLORS["F"], lw=2.5)
            arrow(ax, x0 + 0.35, 1.35, x0, 1.35, color=PHASE_COLORS["B"], lw=2.5)
    ax.text(4, 2.35, "send activation →  (forward)", ha="center", color=PHASE_COLORS["F"], fontsize=11)
    ax.text(4, 0.6, "←  send gradient of the input  (backward)", ha="center", color=PHASE_COLORS["B"], fontsize=11)
    ax.text(4, 0.15, f"one rank busy at a time: each idle (p-1)/p = {ranks - 1}/{ranks} of the step",
            ha="center", fontsize=10)
    return fig


@diagram
def pipeline_timeline(schedule="1F1B", ranks=4, micro=8, width=8.0):
    """One step of a pipeline schedule on ``ranks`` ranks, from torch's plan (T_F = T_B = T_W = 1, free messages).

    ``schedule``: a name of ``ddlcourse.parallel.pipeline_schedules.SCHEDULES`` (GPipe, 1F1B, Interleaved1F1B,
    LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV). Boxes: micro-batch numbers; interleaved
    schedules' second stage per rank is drawn lighter.
    """
    from ddlcourse.parallel import pipeline_schedules as ps

    sim = ps.simulate_bubble(schedule, ranks, micro)             # the notebook's model of torch's plan
    events, bubble = sim["events"], sim["bubble"]
    span = max(e[5] for e in events)
    height = 0.5 * ranks + 1.1
    fig, ax = canvas(width, height)
    sx = (width - 1.2) / span
    for r, kind, stage, mb, t0, t1 in events:
        y = height - 0.75 - (r + 1) * 0.5
        second = stage >= ranks
        box(ax, 1.0 + t0 * sx, y, (t1 - t0) * sx, 0.45, str(mb), color=PHASE_COLORS[kind], fontsize=7,
            alpha=0.55 if second else 1.0)
    for r in range(ranks):
        ax.text(0.9, height - 0.75 - (r + 1) * 0.5 + 0.22, f"rank {r}", ha="right", va="center", fontsize=9)
    pred = ps.predicted_bubble(schedule, ranks, micro)
    split = any(e[1] == "W" for e in events)          # zero bubble: B is the input gradient alone
    legend = "F forward · B input grad · W weight grad" if split else "F forward · B backward"
    ax.text(width / 2, height - 0.35,
            f"{schedule}, p = {ranks}, m = {micro}: bubble {bubble:.0%} (formula {pred:.0%})   {legend}",
            ha="center", fontsize=9)
    return fig


@diagram
def column_row_parallel(ranks=2):
    """Megatron's MLP split: W1 by output features (columns), W2 by input features (rows), one allreduce."""
    fig, ax = canvas(8, 3.4)
    box(ax, 0.2, 1.3, 0.9, 0.9, "x\n(whole)", color="#DDDDDD")
    h = 2.8 / ranks
    for r in range(ranks):
        y = 0.3 + r * h
        c = RANK_COLORS[r]
        arrow(ax, 1.1, 1.75, 1.6, y + h / 2)
        box(ax, 1.6, y, 1.6, h * 0.9, f"x·W1[{r}]ᵀ\ngelu (local)", color=c, textcolor="white", fontsize=9)
        arrow(ax, 3.2, y + h / 2, 3.6, y + h / 2)
        box(ax, 3.6, y, 1.6, h * 0.9, f"h{r}·W2[:, {r}]ᵀ\npartial y", color=c, textcolor="white", fontsize=9)
        arrow(ax, 5.2, y + h / 2, 5.8, 1.75)
    box(ax, 5.8, 1.2, 1.2, 1.1, "allreduce\n(sum)", color=PHASE_COLORS["H"], fontsize=10)
    arrow(ax, 7.0, 1.75, 7.7, 1.75, text="y")
    ax.text(2.4, 3.2, "column-parallel", ha="center", fontsize=10)
    ax.text(4.4, 3.2, "row-parallel", ha="center", fontsize=10)
    return fig


@diagram
def halo_exchange(ranks=3, halo=1):
    """An image split into slabs of rows; each slab is padded with its neighbours' edge rows (zeros at the border)."""
    fig, ax = canvas(8, 4.0)
    rows = 4
    for r in range(ranks):
        x = 0.3 + r * 2.6
        for i in range(rows):
            box(ax, x, 0.9 + i * 0.55, 2.0, 0.5, "", color=RANK_COLORS[r], alpha=0.85)
        for side, y, nb in (("top", 0.9 + rows * 0.55, r - 1), ("bottom", 0.9 - 0.55 * halo, r + 1)):
            inside = 0 <= nb < ranks
            col = RANK_COLORS[nb] if inside else "white"
            p = box(ax, x, y, 2.0, 0.5 * halo, "" if inside else "zeros", color=col, alpha=0.45, fontsize=8)
            p.set_linestyle("--")
        ax.text(x + 1.0, 3.75, f"rank {r}", ha="center", fontsize=11)
        if r < ranks - 1:
            # my last row -> the next rank's top halo; its first row -> my bottom halo
            arrow(ax, x + 2.0, 1.15, x + 2.6, 3.3, color=RANK_COLORS[r])
            arrow(ax, x + 2.6, 2.9, x + 2.0, 0.65, color=RANK_COLORS[r + 1])
    ax.text(4, 0.1, "3×3 conv: halo = dilation·(k−1)/2 = 1 row each side; backward sends halo gradients home",
            ha="center", fontsize=9)
    return fig


@diagram
def dp_tp_pp_mesh(dp=2, pp=2, tp=4, inner="TP"):
    """The ranks as a DP x PP x TP grid: TP inside a node (fast links), PP stages across nodes, DP replicas.

    ``inner`` names the axis inside a node (e.g. "spatial" for lab 2's spatial groups)."""
    fig, ax = canvas(8, 4.5)
    cw, ch = 0.42, 0.5
    for d in range(dp):
        for s in range(pp):
            x0 = 0.4 + s * (tp * cw + 0.9)
            y0 = 3.2 - d * 1.5
            node = box(ax, x0 - 0.1, y0 - 0.15, tp * cw + 0.2, ch + 0.35, "", color="#F2F2F2")
            node.set_linestyle(":")
            for t in range(tp):
                rank = (d * pp + s) * tp + t
                box(ax, x0 + t * cw, y0, cw, ch, str(rank), color=RANK_COLORS[s % 8], textcolor="white", fontsize=9)
            if s < pp - 1:
                arrow(ax, x0 + tp * cw + 0.1, y0 + ch / 2, x0 + tp * cw + 0.8, y0 + ch / 2, text="PP (p2p)")
        ax.text(0.05, 3.2 - d * 1.5 + ch / 2, f"DP {d}", ha="left", va="center", fontsize=9, rotation=90)
    x_mid = 0.4 + tp * cw / 2
    arrow(ax, x_mid, 3.05, x_mid, 3.2 - 1.5 + ch + 0.25, style="<->", color=RANK_COLORS[5], text="DP allreduce")
    ax.text(0.4 + tp * cw / 2, 3.95, f"{inner}: one node, fast links", ha="center", fontsize=9)
    talk = "allreduces every layer" if inner == "TP" else "exchanges every layer"
    middle = ", PP sends activations" if pp > 1 else ""
    ax.text(4, 0.25, f"{dp} × {pp} × {tp} = {dp * pp * tp} ranks: {inner} {talk}{middle}, "
            "DP averages gradients once a step", ha="center", fontsize=9)
    return fig
