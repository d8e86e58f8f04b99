"""Diagrams of part 4 (notebooks 20-22): Megatron's f and g, sequence parallelism, ring attention's blocks
(contiguous and zig-zag), and an MoE layer's dispatch and combine."""
from __future__ import annotations

from instructor.diagrams import PHASE_COLORS, RANK_COLORS, arrow, box, canvas, diagram


@diagram
def megatron_fg(tp=2):
    """One tensor-parallel sub-block: f (identity fwd, all-reduce bwd), column layer, row layer, g (the mirror)."""
    fig, ax = canvas(8, 3.6)
    box(ax, 0.1, 1.35, 0.8, 0.8, "x", color="#DDDDDD")
    box(ax, 1.1, 1.2, 1.0, 1.1, "f", color=PHASE_COLORS["H"], fontsize=16)
    arrow(ax, 0.9, 1.75, 1.1, 1.75)
    h = 2.6 / tp
    for r in range(tp):
        y = 0.45 + r * h
        arrow(ax, 2.1, 1.75, 2.5, y + h * 0.45)
        box(ax, 2.5, y, 2.6, h * 0.9, f"rank {r}: column layer (heads / hidden)\n→ attention or GELU, local\n"
            "→ row layer: partial sum", color=RANK_COLORS[r], textcolor="white", fontsize=8)
        arrow(ax, 5.1, y + h * 0.45, 5.5, 1.75)
    box(ax, 5.5, 1.2, 1.0, 1.1, "g", color=PHASE_COLORS["H"], fontsize=16)
    arrow(ax, 6.5, 1.75, 6.8, 1.75)
    box(ax, 6.8, 1.35, 1.1, 0.8, "+ bias\n+ x", color="#DDDDDD", fontsize=9)
    ax.text(1.6, 3.2, "f: fwd identity\nbwd all-reduce", ha="center", fontsize=9)
    ax.text(6.0, 3.2, "g: fwd all-reduce\nbwd identity", ha="center", fontsize=9)
    ax.text(4, 0.1, "2 all-reduces per sub-block and step (1 fwd + 1 bwd): 4 per transformer block",
            ha="center", fontsize=9)
    return fig


@diagram
def sequence_parallel(tp=2):
    """TP + SP: the norm/residual region holds s/t tokens per rank; g becomes reduce-scatter, f all-gather."""
    fig, ax = canvas(8, 3.4)
    regions = [("LayerNorm, residual\ns/t tokens per rank", "seq"), ("all-gather", "op"),
               ("attention or MLP\nheads / features split", "tp"), ("reduce-scatter", "op"),
               ("LayerNorm, residual\ns/t tokens per rank", "seq")]
    x = 0.2
    widths = {"seq": 1.7, "op": 1.05, "tp": 1.9}
    for text, kind in regions:
        w = widths[kind]
        if kind == "op":
            box(ax, x, 1.2, w, 1.0, text, color=PHASE_COLORS["H"], fontsize=9)
        else:
            for r in range(tp):
                box(ax, x, 0.6 + r * (2.2 / tp), w, 2.2 / tp * 0.9, "", color=RANK_COLORS[r], alpha=0.85)
            ax.text(x + w / 2, 2.95, text, ha="center", va="center", fontsize=8)
            for r in range(tp):
                lab = f"rank {r}: its s/t tokens" if kind == "seq" else f"rank {r}: its heads / features"
                ax.text(x + w / 2, 0.6 + (r + 0.45) * (2.2 / tp), lab, ha="center", va="center", fontsize=8,
                        color="white")
        x += w + 0.05
    ax.text(4, 0.2, "reduce-scatter + all-gather = one all-reduce: the same bytes, (t−1)/t each; "
            "norm activations ÷ t", ha="center", fontsize=9)
    return fig


def _blocks(cp, layout):
    """The rank that owns each of 2·cp query/key chunks (contiguous: 2 chunks per rank in order; zig-zag: r, 2cp-1-r)."""
    n = 2 * cp
    if layout == "zigzag":
        owner = [0] * n
        for r in range(cp):
            owner[r], owner[n - 1 - r] = r, r
        return owner
    return [c // 2 for c in range(n)]


@diagram
def ring_attention(cp=4, layout="contiguous"):
    """The causal score matrix in 2·cp chunks: each row coloured by the rank that owns those queries; the upper
    triangle is skipped. Right: the work (computed score chunks) per rank."""
    fig, ax = canvas(8, 4.5)
    n = 2 * cp
    owner = _blocks(cp, layout)
    s = 3.6 / n
    work = [0.0] * cp
    for qi in range(n):
        for ki in range(n):
            x, y = 0.5 + ki * s, 4.0 - (qi + 1) * s
            if ki > qi:
                continue                                      # wholly in the future: skipped
            diag = ki == qi                                   # computed, with the causal mask inside it
            work[owner[qi]] += 1                              # in chunks: the last rank does (4cp-1)/3 times the first (notebook 21)
            p = box(ax, x, y, s, s, "", color=RANK_COLORS[owner[qi]], alpha=0.45 if diag else 0.9)
            p.set_linewidth(0.4)
        ax.text(0.4, 4.0 - (qi + 0.5) * s, f"r{owner[qi]}", ha="right", va="center", fontsize=7)
    ax.text(0.5 + n * s / 2, 4.15, "keys →   (queries ↓, one row of chunks per query chunk)", ha="center", fontsize=8)
    # the work per rank as bars
    top = max(work)
    for r in range(cp):
        h = 2.6 * work[r] / top
        box(ax, 4.9 + r * 0.7, 0.7, 0.55, max(h, 0.05), "", color=RANK_COLORS[r])
        ax.text(4.9 + r * 0.7 + 0.27, 0.5, f"r{r}", ha="center", fontsize=8)
    ratio = work[-1] / work[0]
    ax.text(6.3, 3.7, f"{layout}: work per rank\nlast / first = {ratio:.2f}", ha="center", fontsize=10)
    ax.text(4, 0.05, f"cp = {cp}: K/V blocks pass round the ring in cp steps (isend/irecv), "
            "online softmax folds each in", ha="center", fontsize=8)
    return fig


@diagram
def online_softmax(blocks=3):
    """Attention over key blocks one at a time: a running max m, sum l and output o, rescaled when m grows."""
    fig, ax = canvas(8, 2.8)
    for b in range(blocks):
        x = 0.2 + b * 6.6 / blocks
        box(ax, x, 1.3, 1.4, 0.8, f"K/V block {b}", color=RANK_COLORS[b % 8], textcolor="white")
        arrow(ax, x + 1.4, 1.7, x + 6.6 / blocks, 1.7, text="m, l, o", fontsize=8)
    box(ax, 0.2 + 6.6, 1.3, 0.9, 0.8, "o / l", color="#DDDDDD")
    ax.text(4, 0.5, "new max m' = max(m, block max); l, o × exp(m − m'); add the block's exp-terms: exact softmax",
            ha="center", fontsize=9)
    return fig


@diagram
def moe_dispatch(ranks=2, experts_per_rank=2, top_k=2):
    """Expert parallelism: route locally, all_to_all the counts, dispatch rows to the experts' ranks, combine back."""
    fig, ax = canvas(8, 4.2)
    n_exp = ranks * experts_per_rank
    h = 3.4 / ranks
    for r in range(ranks):
        y = 0.4 + (ranks - 1 - r) * h
        c = RANK_COLORS[r]
        box(ax, 0.1, y, 1.4, h * 0.85, f"rank {r}\ntokens\n+ router\n(top-{top_k})", color=c, textcolor="white",
            fontsize=8)
        for e in range(experts_per_rank):
            eid = r * experts_per_rank + e
            box(ax, 4.1, y + e * h * 0.85 / experts_per_rank, 1.3, h * 0.85 / experts_per_rank,
                f"expert {eid}", color=c, textcolor="white", fontsize=8, alpha=0.8)
        box(ax, 6.8, y, 1.1, h * 0.85, f"rank {r}\n+ gate ×\nexpert out", color=c, textcolor="white", fontsize=8)
    box(ax, 1.8, 0.4, 1.9, 3.2, "all_to_all\ncounts,\nthen rows\n(dispatch)", color=PHASE_COLORS["H"], fontsize=9)
    box(ax, 5.6, 0.4, 1.0, 3.2, "all_to_all\n(combine)", color=PHASE_COLORS["H"], fontsize=8)
    for r in range(ranks):
        y = 0.4 + (ranks - 1 - r) * h + h * 0.42
        arrow(ax, 1.5, y, 1.8, y)
        arrow(ax, 3.7, y, 4.1, y)
        arrow(ax, 5.4, y, 5.6, y)
        arrow(ax, 6.6, y, 6.8, y)
    ax.text(4, 3.95, f"{n_exp} experts on {ranks} ranks; capacity = ceil(cf · tokens · k / experts); "
            "past it a choice is dropped", ha="center", fontsize=8)
    return fig
