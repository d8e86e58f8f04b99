"""A small decoder-only transformer, written to be read (the model of the transformer-parallelism notebooks).

    x = tok_emb[idx] + pos_emb[pos]                    # (batch, seq, dim)
    for each block:                                    # pre-norm: normalise, transform, add back
        x = x + attn(ln1(x))                           # causal self-attention, n_heads heads
        x = x + mlp(ln2(x))                            # dense MLP, or a mixture of experts (MoE)
    logits = head(ln_f(x))                             # (batch, seq, vocab)

Choices that make the parallel versions easy to check against this serial one:

* attention is written out (scores, mask, softmax), and the module takes an ``attn_fn`` so that context
  parallelism can swap in ring attention without touching the rest;
* the heads are inferred from the projections' sizes (``head_dim`` is fixed), so a rank that keeps only
  some heads (tensor parallelism) runs the same code;
* the model takes explicit positions ``pos``: a rank that holds a slice of the sequence (context
  parallelism, zig-zag order included) embeds and masks by the true positions.

The MoE layer (``n_experts > 0``) routes each token to its ``top_k`` experts, each expert takes at most
``capacity`` tokens of a group (GShard's groups: with expert parallelism a group is one rank's tokens),
and the layer adds a load-balancing loss (Switch Transformer). See :func:`route`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ddlcourse.data import tokens


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int = 16
    seq_len: int = 32
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    n_experts: int = 0           # 0: dense MLP; > 0: a mixture of experts in every block
    top_k: int = 2               # experts per token (MoE)
    capacity_factor: float = 1.25  # expert capacity = ceil(capacity_factor * tokens * top_k / n_experts)
    aux_weight: float = 0.01     # weight of the load-balancing loss

    def __post_init__(self):
        for name in ("vocab", "seq_len", "dim", "n_heads", "n_layers", "mlp_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.top_k <= self.n_experts):
            raise ValueError(f"need 1 <= top_k <= n_experts, got top_k={self.top_k}, n_experts={self.n_experts}")
        if self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be positive, got {self.capacity_factor}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden(self) -> int:
        return self.mlp_ratio * self.dim

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- attention
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention where a query sees only keys at the same or earlier positions.

    q: (batch, heads, Tq, head_dim); k, v: (batch, heads, Tk, head_dim); positions default to 0..T-1.
    """
    Tq, Tk = q.shape[-2], k.shape[-2]
    q_pos = torch.arange(Tq, device=q.device) if q_pos is None else q_pos
    k_pos = torch.arange(Tk, device=k.device) if k_pos is None else k_pos
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])         # (batch, heads, Tq, Tk)
    future = k_pos[None, :] > q_pos[:, None]                           # (Tq, Tk): True where masked
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v                            # (batch, heads, Tq, head_dim)


class Attention(nn.Module):
    """Multi-head causal self-attention. ``attn_fn(q, k, v, q_pos, k_pos)`` does the softmax part."""

    def __init__(self, dim: int, n_heads: int, attn_fn=causal_attention):
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim) for _ in range(3))
        self.wo = nn.Linear(dim, dim)
        self.attn_fn = attn_fn

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape

        def heads(t):  # (B, T, h*hd) -> (B, h, T, hd); h = what this rank holds (all heads, or a TP slice)
            return t.view(B, T, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        o = self.attn_fn(q, k, v, pos, pos)                               # (B, h, T, hd)
        return self.wo(o.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


# --------------------------------------------------------------------------- mixture of experts
def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Most tokens one expert takes from a group of ``n_tokens``: ceil(cf * n_tokens * top_k / n_experts)."""
    return max(1, math.ceil(capacity_factor * n_tokens * top_k / n_experts))


def route(logits: torch.Tensor, top_k: int, capacity: int):
    """Top-k routing with a capacity limit, for one group of tokens.

    logits: (tokens, n_experts). Returns ``(experts, gates, keep, aux)``:
    experts (tokens, k) the chosen experts; gates (tokens, k) their softmax probabilities renormalised over
    the k choices; keep (tokens, k) False where the expert was already full (the token is *dropped* for that
    expert: it passes through the residual only); aux the load-balancing loss
    ``n_experts * sum_e f_e * P_e`` (f_e: share of the assignments to expert e, P_e: its mean probability),
    which is 1 when the load is uniform and grows with imbalance.

    Priority: choice 1 of every token before choice 2, earlier tokens first (as in GShard).
    """
    n, E = logits.shape
    probs = torch.softmax(logits, dim=-1)
    gates, experts = probs.topk(top_k, dim=-1)                           # (n, k)
    gates = gates / gates.sum(-1, keepdim=True)
    onehot = F.one_hot(experts.t().reshape(-1), E)                      # (k*n, E): choice-major order
    slot = (onehot.cumsum(0) - 1)[onehot.bool()].view(top_k, n).t()     # (n, k): place in the expert's queue
    keep = slot < capacity
    f = onehot.float().mean(0)                                   # share of assignments per expert
    aux = E * (f * probs.mean(0)).sum()
    return experts, gates, keep, aux


class MoE(nn.Module):
    """A mixture of ``n_experts`` MLPs with top-k routing. ``n_groups``: tokens are routed in that many
    equal groups, each with its own capacity (with expert parallelism a group is one rank's tokens).

    After a forward, ``self.aux`` holds the load-balancing loss and ``self.stats`` the routing counts.
    """

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int = 2, capacity_factor: float = 1.25,
                 n_groups: int = 1):
        super().__init__()
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dim, hidden) for _ in range(n_experts))
        self.top_k, self.capacity_factor, self.n_groups = top_k, capacity_factor, n_groups
        self.aux = torch.zeros(())
        self.stats: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                      # (tokens, dim)
        if x.shape[0] % self.n_groups:
            raise ValueError(f"{x.shape[0]} tokens do not split into {self.n_groups} equal routing groups")
        outs, auxes, load, dropped = [], [], 0, 0
        for xg in x.chunk(self.n_groups):
            cap = expert_capacity(xg.shape[0], len(self.experts), self.top_k, self.capacity_factor)
            experts, gates, keep, aux = route(self.router(xg), self.top_k, cap)
            y = torch.zeros_like(xg)
            for e, expert in enumerate(self.experts):
                tok, choice = torch.nonzero((experts == e) & keep, as_tuple=True)
                if len(tok):
                    y = y.index_add(0, tok, gates[tok, choice, None] * expert(xg[tok]))
            outs.append(y)
            auxes.append(aux)
            load = load + torch.bincount(experts[keep], minlength=len(self.experts))
            dropped += int((~keep).sum())
        self.aux = torch.stack(auxes).mean()
        self.stats = dict(load=load.tolist(), dropped=dropped, assignments=x.shape[0] * self.top_k)
        return torch.cat(outs).view(shape)


# --------------------------------------------------------------------------- the model
class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg.dim, cfg.n_heads)
        self.mlp = (MoE(cfg.dim, cfg.hidden, cfg.n_experts, cfg.top_k, cfg.capacity_factor) if cfg.n_experts
                    else MLP(cfg.dim, cfg.hidden))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), pos)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Decoder-only transformer: ``forward(idx, pos=None) -> logits`` with idx (batch, seq) token ids."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device) if pos is None else pos
        if not pos.is_meta and int(pos.max()) >= self.cfg.seq_len:     # (meta: the budget planner's dry run)
            raise ValueError(f"position {int(pos.max())} is past the model's seq_len {self.cfg.seq_len}")
        x = self.tok_emb(idx) + self.pos_emb(pos)                           # (batch, seq, dim)
        for block in self.blocks:
            x = block(x, pos)
        return self.head(self.ln_f(x))                                      # (batch, seq, vocab)

    def aux_loss(self) -> torch.Tensor:
        """Sum of the MoE layers' load-balancing losses of the last forward (0 for a dense model)."""
        aux = [b.mlp.aux for b in self.blocks if isinstance(b.mlp, MoE)]
        return torch.stack(aux).sum() if aux else torch.zeros(())

    def set_attn_fn(self, fn) -> None:
        """Use ``fn(q, k, v, q_pos, k_pos)`` for the attention of every block (ring attention, ...)."""
        for b in self.blocks:
            b.attn.attn_fn = fn


def build(cfg: TransformerConfig | None = None, seed: int = 0, device=None, **kw) -> Transformer:
    """The model with a fixed initialisation (the same ``seed`` gives the same weights on every rank)."""
    cfg = cfg or TransformerConfig(**kw)
    torch.manual_seed(seed)
    return Transformer(cfg).to(device or "cpu")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of next-token prediction; targets of -100 (the prompt) are ignored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                           reduction=reduction)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train_sort(cfg: TransformerConfig, steps: int, batch: int, lr: float = 3e-3, n_symbols: int | None = None,
               seed: int = 0, device=None, eval_every: int = 0) -> dict:
    """Train on the sort task (:mod:`ddlcourse.data.tokens`) on one process; the loss curve and accuracy.

    ``n_symbols`` defaults to ``cfg.vocab - 1``; ``cfg.seq_len`` must be ``2 * length``.
    """
    n_symbols = n_symbols or cfg.vocab - 1
    if cfg.seq_len % 2 or tokens.sort_task_vocab(n_symbols) > cfg.vocab:
        raise ValueError(f"the sort task needs an even seq_len and vocab >= n_symbols + 1; got {cfg}")
    length = cfg.seq_len // 2
    model = build(cfg, seed=seed, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, accs = [], []
    for step in range(steps):
        x, y = tokens.sort_batch(batch, n_symbols, length, seed=seed + 1, start=step * batch, device=device)
        logits = model(x)
        loss = lm_loss(logits, y)
        opt.zero_grad()
        (loss + cfg.aux_weight * model.aux_loss()).backward()
        opt.step()
        losses.append(float(loss.detach()))
        if eval_every and (step + 1) % eval_every == 0:
            accs.append((step + 1, tokens.sorted_accuracy(logits, y)))
    xt, yt = tokens.sort_batch(256, n_symbols, length, seed=seed + 2, device=device)   # held-out samples
    with torch.no_grad():
        lt = model(xt)
    return dict(losses=losses, accuracy=accs, test_loss=float(lm_loss(lt, yt)),
                test_accuracy=tokens.sorted_accuracy(lt, yt), chance_loss=tokens.chance_loss(n_symbols),
                model=model)
