"""Diagrams of part 5 (notebooks 23-30): number formats and the loss scale, a straggler and exposed
communication, a checkpoint/restart timeline, DCP resharding, the data pipeline, successive halving, and
the layout calculator's choice."""
from __future__ import annotations

import math

from instructor.diagrams import INK, PHASE_COLORS, RANK_COLORS, arrow, box, canvas, diagram

# sign / exponent / mantissa bits (IEEE 754 binary32 and binary16; bfloat16 keeps fp32's exponent)
FORMATS = {"fp32": (1, 8, 23), "bf16": (1, 8, 7), "fp16": (1, 5, 10)}


@diagram
def number_formats():
    """fp32, bf16 and fp16 as rows of bits: sign, exponent (range), mantissa (precision)."""
    fig, ax = canvas(8, 3.0)
    bit = 7.0 / 32
    for i, (name, (s, e, m)) in enumerate(FORMATS.items()):
        y = 2.2 - i * 0.8
        ax.text(0.05, y + 0.25, name, va="center", fontsize=11)
        x = 0.8
        for n, col, lab in ((s, "#DDDDDD", "s"), (e, RANK_COLORS[0], f"exponent {e}"), (m, RANK_COLORS[1], f"mantissa {m}")):
            box(ax, x, y, n * bit, 0.5, lab if n > 1 else "", color=col, fontsize=8,
                textcolor="white" if n > 1 else INK)
            x += n * bit
    ax.text(4, 0.15, "exponent bits set the range (fp16: 6e-8 … 65504), mantissa bits the spacing near 1",
            ha="center", fontsize=9)
    return fig


@diagram
def loss_scaling(scale_log2=16):
    """Gradient magnitudes on a log axis: fp16's range, gradients that underflow, and the same × 2^k."""
    fig, ax = canvas(8, 3.0)
    lo, hi = -32, 18                                      # log2 range drawn

    def x(e):
        return 0.4 + 7.2 * (e - lo) / (hi - lo)
    box(ax, x(-24), 1.9, x(math.log2(65504)) - x(-24), 0.5, "fp16 holds these (2⁻²⁴ … 65504)", color="#DDDDDD",
        fontsize=9)
    g0, g1 = -30, -28                                     # a few 1e-9: notebook 23's gradients
    box(ax, x(g0), 1.1, x(g1) - x(g0), 0.5, "", color=RANK_COLORS[5])
    ax.text(x(g1) + 0.1, 1.35, "grads ≈ 1e-9 → round to 0", va="center", fontsize=9, color=RANK_COLORS[5])
    box(ax, x(g0 + scale_log2), 0.4, x(g1) - x(g0), 0.5, "", color=RANK_COLORS[2])
    ax.text(x(g1 + scale_log2) + 0.1, 0.65, f"× 2^{scale_log2}: representable", va="center", fontsize=9,
            color=RANK_COLORS[2])
    arrow(ax, x(g1) - 0.1, 1.05, x(g0 + scale_log2) + 0.1, 0.95, color=RANK_COLORS[2])
    for e in (-24, -16, -8, 0, 8, 16):
        ax.text(x(e), 2.6, f"2^{e}", ha="center", fontsize=8)
    return fig


@diagram
def straggler_allreduce(ranks=4, slow=1):
    """A DDP step per rank: the straggler's compute is longer, the others wait inside the allreduce."""
    fig, ax = canvas(8, 0.55 * ranks + 1.2)
    top = 0.55 * ranks + 0.7
    for r in range(ranks):
        y = top - (r + 1) * 0.55
        comp = 4.6 if r == slow else 3.2
        box(ax, 1.0, y, comp, 0.45, "forward + backward", color=PHASE_COLORS["F"], fontsize=8)
        box(ax, 1.0 + comp, y, 6.2 - comp, 0.45, "allreduce (waits)" if r != slow else "ar", color=PHASE_COLORS["H"],
            fontsize=8)
        ax.text(0.9, y + 0.22, f"rank {r}" + (" (slow)" if r == slow else ""), ha="right", va="center", fontsize=8)
    ax.text(4.5, top + 0.15, "the straggler waits least in the allreduce: shortest allreduce = slowest rank",
            ha="center", fontsize=9)
    return fig


@diagram
def exposed_comm(buckets=4):
    """Bucketed allreduces overlap the backward pass; only the tail after backward ends is exposed."""
    fig, ax = canvas(8, 2.6)
    box(ax, 0.4, 1.5, 5.2, 0.5, "backward (layers last → first)", color=PHASE_COLORS["B"], fontsize=9)
    t = 0.4
    for b in range(buckets):
        ready = 0.4 + 5.2 * (b + 1) / buckets
        start = max(ready, t)
        box(ax, start, 0.8, 1.2, 0.5, f"bucket {b}", color=PHASE_COLORS["H"], fontsize=8)
        t = start + 1.2
    ax.axvline(5.6, ymin=0.2, ymax=0.85, color=INK, ls="--", lw=1)
    arrow(ax, 5.6, 0.55, t, 0.55, style="<->", color=RANK_COLORS[5], text="exposed", fontsize=9)
    ax.text(4, 2.3, "exposed = comm intervals minus compute intervals", ha="center", fontsize=10)
    return fig


@diagram
def checkpoint_restart(steps=12, every=4, kill_at=9):
    """Steps on a time line: checkpoints every ``every`` steps, a rank killed after ``kill_at``, torchrun restarts
    the job and it resumes from the last checkpoint, repeating at most one interval."""
    fig, ax = canvas(8, 2.8)
    last = (kill_at // every) * every
    n_cols = kill_at + 1 + (steps - last)
    w = 7.0 / (n_cols + 1.5)
    x = 0.4
    for s in range(1, kill_at + 1):
        box(ax, x, 1.4, w, 0.5, str(s), color=PHASE_COLORS["F"], fontsize=7)
        if s % every == 0:
            ax.plot([x + w, x + w], [1.3, 2.1], color=RANK_COLORS[2], lw=2.5)
        x += w
    ax.text(x + 0.05, 1.65, "✗", color=RANK_COLORS[5], fontsize=16, va="center")
    box(ax, x + 0.35, 1.4, 1.5 * w, 0.5, "restart", color="#DDDDDD", fontsize=7)
    x += 0.35 + 1.5 * w
    for s in range(last + 1, steps + 1):
        box(ax, x, 1.4, w, 0.5, str(s), color=PHASE_COLORS["F"] if s > kill_at else PHASE_COLORS["B"], fontsize=7)
        x += w
    ax.text(4, 2.45, f"checkpoint every {every} steps (green bars); killed after step {kill_at}; resume at "
            f"step {last}: what came after it is repeated (orange)", ha="center", fontsize=8)
    ax.text(4, 0.7, "save: write step_N.pt.tmp, then os.replace → a crash never leaves a half checkpoint",
            ha="center", fontsize=9)
    return fig


@diagram
def dcp_reshard(rows=8, old=2, new=4):
    """A parameter's rows saved as ``old`` shards (one file per rank), loaded by ``new`` ranks: each reads the
    overlapping pieces."""
    fig, ax = canvas(8, 3.4)
    h = 2.6 / rows
    for i in range(rows):
        o, n = i * old // rows, i * new // rows
        box(ax, 1.0, 0.4 + (rows - 1 - i) * h, 1.6, h, f"row {i}", color=RANK_COLORS[o], fontsize=7, textcolor="white")
        box(ax, 5.2, 0.4 + (rows - 1 - i) * h, 1.6, h, f"row {i}", color=RANK_COLORS[n], fontsize=7, textcolor="white")
        arrow(ax, 2.6, 0.4 + (rows - 0.5 - i) * h, 5.2, 0.4 + (rows - 0.5 - i) * h, color="#999999", lw=0.8)
    ax.text(1.8, 3.15, f"saved by {old} ranks\n(colour: file)", ha="center", fontsize=9)
    ax.text(6.0, 3.15, f"loaded by {new} ranks\n(colour: new owner)", ha="center", fontsize=9)
    ax.text(3.9, 0.1, "DCP: shards + metadata; the loader reads only the overlaps", ha="center", fontsize=9)
    return fig


@diagram
def data_pipeline(workers=2):
    """Storage → sharded .npy files → DataLoader workers → prefetch queue → the training step."""
    fig, ax = canvas(8, 3.2)
    box(ax, 0.1, 1.1, 1.3, 1.1, "shards\n+ index\n(.npy, mmap)", color="#DDDDDD", fontsize=8)
    for w in range(workers):
        y = 0.5 + w * (2.4 / workers)
        box(ax, 2.0, y, 1.6, 2.4 / workers * 0.85, f"worker {w}\nread + decode", color=RANK_COLORS[w],
            textcolor="white", fontsize=8)
        arrow(ax, 1.4, 1.65, 2.0, y + 0.5)
        arrow(ax, 3.6, y + 0.5, 4.2, 1.65)
    box(ax, 4.2, 1.1, 1.5, 1.1, "prefetch\nqueue\n(pinned)", color=PHASE_COLORS["H"], fontsize=8)
    arrow(ax, 5.7, 1.65, 6.3, 1.65)
    box(ax, 6.3, 1.1, 1.5, 1.1, "training\nstep", color=PHASE_COLORS["F"], fontsize=9)
    ax.text(4, 0.1, "input-bound if both ≈ loader + step; overlapped if both ≈ max(loader, step)",
            ha="center", fontsize=9)
    return fig


@diagram
def successive_halving(n=27, eta=3, min_budget=1):
    """Rungs of successive halving: n configs at the smallest budget, keep n // eta, budget × eta, repeat."""
    fig, ax = canvas(8, 3.2)
    rungs, k, b = [], n, min_budget
    while k >= 1:
        rungs.append((k, b))
        if k < eta:
            break
        k, b = k // eta, b * eta
    w = 7.2 / len(rungs)
    for i, (k, b) in enumerate(rungs):
        bar = 1.9 * k / n
        box(ax, 0.4 + i * w, 0.5, w * 0.7, max(bar, 0.1), "", color=RANK_COLORS[i % 8])
        ax.text(0.4 + i * w + w * 0.35, 0.6 + bar, f"{k} configs\n× budget {b}", ha="center", fontsize=8)
    ax.text(4, 0.15, f"η = {eta}: every rung spends about the same compute, most of it on the best", ha="center",
            fontsize=9)
    return fig


@diagram
def alpha_beta_ring(ranks=4):
    """The alpha-beta model of a ring allreduce: 2(p-1) steps of n/p bytes, each alpha + (n/p) beta."""
    fig, ax = canvas(8, 2.6)
    steps = 2 * (ranks - 1)
    w = 7.0 / steps
    for s in range(steps):
        kind = "reduce-scatter" if s < ranks - 1 else "all-gather"
        box(ax, 0.5 + s * w, 1.2, w, 0.6, "α + (n/p)β", color=RANK_COLORS[0] if s < ranks - 1 else RANK_COLORS[2],
            fontsize=7, textcolor="white")
        if s in (0, ranks - 1):
            ax.text(0.5 + s * w, 2.0, kind, fontsize=9)
    ax.text(4, 0.6, f"p = {ranks}: T = 2(p−1)·α + 2(p−1)/p · n·β   (latency grows with p, bytes do not)",
            ha="center", fontsize=10)
    return fig
