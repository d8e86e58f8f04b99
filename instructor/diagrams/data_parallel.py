"""Diagrams of part 2: collectives (ring, tree, hierarchical), overlap, parameter server, federated averaging."""
from __future__ import annotations

import math

from instructor.diagrams import INK, PHASE_COLORS, RANK_COLORS, arrow, box, canvas, diagram

_LIGHT = "#F4F4F4"


def ring_schedule(n: int) -> list[list[list[frozenset]]]:
    """The ring allreduce's state after each step: ``states[k][rank][chunk]`` = the ranks summed into that copy.

    Reduce-scatter step s: rank r sends chunk (r - s) mod n right; the receiver adds it into its own copy.
    Allgather step s: rank r passes its finished chunk (r + 1 - s) mod n right; the receiver stores it.
    (The schedule of notebook 04, section "The ring allreduce, written by hand".)"""
    state = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    states = [state]
    for s in range(n - 1):
        new = [row[:] for row in state]
        for r in range(n):
            c, dst = (r - s) % n, (r + 1) % n
            new[dst][c] = state[dst][c] | state[r][c]
        state = new
        states.append(state)
    for s in range(n - 1):
        new = [row[:] for row in state]
        for r in range(n):
            c, dst = (r + 1 - s) % n, (r + 1) % n
            new[dst][c] = state[r][c]
        state = new
        states.append(state)
    return states


@diagram
def ring_allreduce(ranks=4):
    """Each step of a ring allreduce: rows are ranks, columns chunks; a cell names the ranks summed into it.
    Top row: the start and the N-1 reduce-scatter steps; bottom row: the N-1 allgather steps."""
    n = ranks
    states = ring_schedule(n)
    cell = min(0.5, 9.4 / (n * (n + 0.6)))
    pw = cell * n + 0.45
    ph = cell * n + 0.75
    fig, ax = canvas(max(pw * n + 0.5, 8), 2 * ph + 0.7)
    for k, st in enumerate(states):
        row, col = (0, k) if k < n else (1, k - n + 1)
        x0 = 0.4 + col * pw
        y0 = 0.7 + (1 - row) * ph
        label = "start" if k == 0 else (f"reduce-scatter {k}" if k < n else f"allgather {k - n + 1}")
        ax.text(x0 + cell * n / 2, y0 + cell * n + 0.12, label, ha="center", fontsize=10, color=INK)
        for r in range(n):
            for c in range(n):
                have = st[r][c]
                full = len(have) == n
                txt = "Σ" if full else "+".join(str(i) for i in sorted(have))
                box(ax, x0 + c * cell, y0 + cell * (n - 1 - r), cell, cell, txt,
                    color=RANK_COLORS[c % 8] if full else _LIGHT, fontsize=max(5, 10 - n))
        if col == 0 or k == n:
            for r in range(n):
                ax.text(x0 - 0.05, y0 + cell * (n - 1 - r) + cell / 2, f"r{r}", ha="right", va="center", fontsize=9)
    ax.text(0.4, 0.25, f"{n} ranks: 2(N-1) = {2 * (n - 1)} steps; each rank sends 2(N-1)/N = {2 * (n - 1) / n:.2f}x "
            "the gradient's bytes, whatever N  (Σ: that chunk's full sum)", fontsize=10, color=INK)
    return fig


@diagram
def tree_allreduce(ranks=8):
    """Reduce up a binary tree, then broadcast down: 2 log2(N) steps, each moving the whole message."""
    levels = int(math.log2(ranks))
    fig, ax = canvas(10, 4.6)
    ax.text(0.2, 4.3, f"reduce: {levels} steps up", fontsize=11, weight="bold", color=INK)
    ax.text(5.4, 4.3, f"broadcast: {levels} steps down", fontsize=11, weight="bold", color=INK)
    w = 4.4 / ranks
    dy = 3.2 / levels
    for x0, up in ((0.2, True), (5.4, False)):
        for lvl in range(levels + 1):
            step = 2 ** lvl
            y = 0.5 + lvl * dy
            for r in range(0, ranks, step):
                box(ax, x0 + r * w, y, w * 0.95, 0.42, f"{r}", color=RANK_COLORS[r % 8], fontsize=9,
                    textcolor="white" if r % 8 in (0, 5, 7) else INK)
                if lvl:      # the edge between r (parent, this level) and r + step/2 (child, the level below)
                    child = (x0 + (r + step // 2) * w + w / 2, y - dy + 0.42)
                    parent = (x0 + r * w + w / 2, y)
                    a, b = (child, parent) if up else (parent, child)
                    arrow(ax, *a, *b, color="#555555")
    ax.text(5.0, 0.05, f"{ranks} ranks: 2 log2 N = {2 * levels} steps, each of the whole message: few steps (latency), "
            "more bytes than the ring", ha="center", fontsize=10, color=INK)
    return fig


@diagram
def bucketed_overlap(layers=6, buckets=3):
    """Backward makes the last layer's gradient first; a full bucket's allreduce runs while backward goes on."""
    fig, ax = canvas(11, 4.4)
    unit = 0.9
    per = layers // buckets
    comm = per * unit * 0.8
    ax.text(0.1, 4.1, "after backward (no overlap)", fontsize=11, weight="bold", color=INK)
    ax.text(0.1, 2.0, f"buckets of {per} layers, all-reduced during backward (DDP, Horovod)", fontsize=11,
            weight="bold", color=INK)
    for row, y in ((0, 3.2), (1, 1.1)):
        for i in range(layers):
            box(ax, 0.2 + i * unit, y, unit, 0.6, f"B{layers - i}", color=PHASE_COLORS["B"], fontsize=10)
        ax.text(0.15, y + 0.3, "", fontsize=9)
    end = 0.2 + layers * unit
    for b in range(buckets):     # no overlap: all allreduces after the whole backward
        box(ax, end + b * comm, 2.55, comm, 0.55, f"AR {b + 1}", color=PHASE_COLORS["H"], fontsize=10)
    t_after = end + buckets * comm
    t = 0.2
    for b in range(buckets):     # overlap: bucket b is ready when its layers' backward is done
        ready = 0.2 + (b + 1) * per * unit
        t = max(t, ready)
        box(ax, t, 0.45, comm, 0.55, f"AR {b + 1}", color=PHASE_COLORS["H"], fontsize=10)
        t += comm
    t_over = t
    for y, tt in ((2.55, t_after), (0.45, t_over)):
        arrow(ax, tt + 0.1, y + 0.27, tt + 0.6, y + 0.27, style="-")
        ax.text(tt + 0.65, y + 0.27, "step", va="center", fontsize=10, color=INK)
    ax.text(0.2, 0.05, "B: backward of a layer (last layer first)   AR: allreduce of a bucket", fontsize=9.5, color="#444444")
    return fig


@diagram
def param_server_vs_allreduce(workers=4):
    """A server sends the parameters to every worker; in a ring every rank sends about 2P, whatever N."""
    fig, ax = canvas(10.5, 4.6)
    ax.text(0.2, 4.3, "parameter server", fontsize=12, weight="bold", color=INK)
    ax.text(5.6, 4.3, "ring allreduce", fontsize=12, weight="bold", color=INK)
    box(ax, 1.6, 3.1, 1.8, 0.7, "server", color=RANK_COLORS[5], textcolor="white")
    for w in range(workers):
        x = 0.2 + w * (4.6 / workers)
        box(ax, x, 0.9, 4.6 / workers - 0.1, 0.6, f"worker {w}", color=RANK_COLORS[w % 8], fontsize=9.5, alpha=0.8)
        cx = x + (4.6 / workers - 0.1) / 2
        arrow(ax, cx - 0.08, 1.5, 2.45, 3.1, color="#555555")
        arrow(ax, 2.55, 3.1, cx + 0.08, 1.5, color=RANK_COLORS[5])
    ax.text(2.5, 0.45, f"server sends W·P = {workers}P per step\n(grows with the workers; S shards: W·P/S)",
            ha="center", va="center", fontsize=10, color=INK)
    n = workers
    cx, cy, rad = 7.8, 2.45, 1.25
    pts = [(cx + rad * math.sin(2 * math.pi * i / n), cy + rad * math.cos(2 * math.pi * i / n)) for i in range(n)]
    for i, (x, y) in enumerate(pts):
        x1, y1 = pts[(i + 1) % n]
        arrow(ax, x, y, x1, y1, color="#555555")
    for i, (x, y) in enumerate(pts):
        box(ax, x - 0.45, y - 0.28, 0.9, 0.56, f"rank {i}", color=RANK_COLORS[i % 8], fontsize=9.5, alpha=0.9)
    ax.text(7.8, 0.45, f"each rank sends 2(N-1)/N·P = {2 * (n - 1) / n:.2f}P\n(about 2P for any N; no one is special)",
            ha="center", va="center", fontsize=10, color=INK)
    return fig


@diagram
def hierarchical_allreduce(nodes=2, gpus=4):
    """Reduce inside each node onto its leader, allreduce between the leaders, broadcast inside each node."""
    fig, ax = canvas(10.5, 4.6)
    w = 10.0 / nodes
    for m in range(nodes):
        x0 = 0.25 + m * w
        box(ax, x0, 0.7, w - 0.5, 2.7, "", color="#F7F7F7", edge="#999999")
        ax.text(x0 + 0.15, 3.15, f"node {m}  (NVLink inside)", fontsize=10, color=INK)
        gw = (w - 0.8) / gpus
        for g in range(gpus):
            r = m * gpus + g
            box(ax, x0 + 0.15 + g * gw, 1.0, gw * 0.92, 0.6, f"{r}", color=RANK_COLORS[g % 8], fontsize=10,
                textcolor="white" if g % 8 in (0, 5, 7) else INK)
            if g:
                arrow(ax, x0 + 0.15 + g * gw + gw * 0.46, 1.6, x0 + 0.15 + gw * 0.46 + 0.1, 2.1,
                      color="#555555", lw=1.0, style="<->")
        box(ax, x0 + 0.15, 2.1, gw * 0.92, 0.6, f"leader {m * gpus}", color=RANK_COLORS[0], fontsize=9, textcolor="white")
    for m in range(nodes - 1):
        x0 = 0.25 + m * w + 0.15 + ((w - 0.8) / gpus) * 0.92
        arrow(ax, x0, 2.4, 0.25 + (m + 1) * w + 0.15, 2.4, color=RANK_COLORS[5], style="<->", lw=2.2,
              text="allreduce (network)", fontsize=10)
    ax.text(5.25, 0.25, "1 reduce in the node  →  2 allreduce between leaders  →  3 broadcast in the node "
            "(same sum as the flat allreduce)", ha="center", fontsize=10, color=INK)
    return fig


@diagram
def fedavg_vs_dp(local_steps=4, rounds=2):
    """Data parallelism averages gradients every step; FedAvg averages models after many local steps."""
    fig, ax = canvas(10.5, 3.8)
    steps = local_steps * rounds
    u = 8.6 / steps
    ax.text(0.1, 3.45, "data parallelism: allreduce the gradients after every step", fontsize=11, weight="bold", color=INK)
    ax.text(0.1, 1.6, f"FedAvg / local SGD: {local_steps} local steps, then average the models", fontsize=11,
            weight="bold", color=INK)
    for i in range(steps):
        box(ax, 1.2 + i * u, 2.45, u * 0.62, 0.6, "step", color=PHASE_COLORS["F"], fontsize=9)
        box(ax, 1.2 + i * u + u * 0.62, 2.45, u * 0.38, 0.6, "AR", color=PHASE_COLORS["H"], fontsize=8)
        box(ax, 1.2 + i * u, 0.6, u * 0.62, 0.6, "step", color=PHASE_COLORS["F"], fontsize=9)
        if (i + 1) % local_steps == 0:
            box(ax, 1.2 + i * u + u * 0.62, 0.6, u * 0.38, 0.6, "avg", color=PHASE_COLORS["W"], fontsize=8)
    ax.text(0.1, 2.75, "every\nrank", fontsize=9, va="center", color=INK)
    ax.text(0.1, 0.9, "every\ndevice", fontsize=9, va="center", color=INK)
    ax.text(5.3, 0.12, f"{local_steps}x fewer messages; with 1 local step of plain SGD the two are the same algorithm",
            ha="center", fontsize=10, color=INK)
    return fig


@diagram
def no_sync_accumulation(micro=3):
    """Gradient accumulation with DDP: no_sync on every micro-batch's backward but the last; one allreduce."""
    fig, ax = canvas(10.5, 3.6)
    u = 2.2
    ax.text(0.1, 3.3, "with no_sync(): one allreduce per step", fontsize=11, weight="bold", color=INK)
    ax.text(0.1, 1.55, "without: one allreduce per micro-batch", fontsize=11, weight="bold", color=INK)
    for i in range(micro):
        box(ax, 0.2 + i * u, 2.3, u * 0.75, 0.6, f"F+B {i + 1}", color=PHASE_COLORS["B"], fontsize=10)
        box(ax, 0.2 + i * u, 0.55, u * 0.75, 0.6, f"F+B {i + 1}", color=PHASE_COLORS["B"], fontsize=10)
        box(ax, 0.2 + i * u + u * 0.75, 0.55, u * 0.25, 0.6, "AR", color=PHASE_COLORS["H"], fontsize=8)
    box(ax, 0.2 + (micro - 1) * u + u * 0.75, 2.3, u * 0.25, 0.6, "AR", color=PHASE_COLORS["H"], fontsize=8)
    box(ax, 0.2 + micro * u + 0.1, 2.3, 0.9, 0.6, "step", color=PHASE_COLORS["W"], fontsize=10)
    box(ax, 0.2 + micro * u + 0.1, 0.55, 0.9, 0.6, "step", color=PHASE_COLORS["W"], fontsize=10)
    ax.text(5.2, 0.1, f"the same gradient either way (each loss divided by {micro}); without no_sync {micro}x the traffic",
            ha="center", fontsize=10, color=INK)
    return fig


@diagram
def five_steps():
    """Serial script to data-parallel in five steps."""
    fig, ax = canvas(10.5, 2.6)
    steps = [("1 import", "torch.distributed,\nHorovod"), ("2 init", "process group:\ngloo / nccl"),
             ("3 broadcast", "rank 0's initial\nparameters"), ("4 aggregate", "allreduce-mean of\nthe gradients"),
             ("5 finalize", "destroy the\nprocess group")]
    for i, (h, t) in enumerate(steps):
        x = 0.15 + i * 2.08
        box(ax, x, 1.35, 1.9, 0.8, h, color=RANK_COLORS[i % 8], fontsize=11,
            textcolor="white" if i == 0 else INK)
        ax.text(x + 0.95, 1.2, t, ha="center", va="top", fontsize=9.5, color=INK)
        if i < 4:
            arrow(ax, x + 1.9, 1.75, x + 2.08, 1.75)
    return fig


@diagram
def syncbn_allreduce(ranks=4, channels=3):
    """Per-rank batch statistics against synchronized ones: one allreduce of [count, C sums], then of C squares."""
    fig, ax = canvas(10.5, 4.0)
    w = 9.8 / ranks
    for r in range(ranks):
        x = 0.3 + r * w
        box(ax, x, 2.5, w - 0.3, 0.7, f"rank {r}: its micro-batch", color=RANK_COLORS[r % 8], fontsize=10,
            alpha=0.8)
        box(ax, x, 1.5, w - 0.3, 0.6, f"[count, {channels} sums]", color="#EEEEEE", fontsize=9.5)
        arrow(ax, x + (w - 0.3) / 2, 2.5, x + (w - 0.3) / 2, 2.1)
        arrow(ax, x + (w - 0.3) / 2, 1.5, 5.2, 0.95, color="#777777")
    box(ax, 2.2, 0.25, 6.0, 0.7, f"allreduce {channels + 1} numbers → global mean; "
        f"then {channels} sums of squares → global variance", color=PHASE_COLORS["H"], fontsize=10)
    ax.text(0.3, 3.55, "each rank normalises with the statistics of the whole global batch", fontsize=11,
            weight="bold", color=INK)
    return fig
