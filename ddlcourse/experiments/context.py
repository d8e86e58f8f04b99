"""Notebooks 21 and 30 · ring attention (:mod:`ddlcourse.parallel.context`) against full attention: forward and
backward, the whole model, work per rank, memory, training."""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as tdist

from ddlcourse import layout as lay_mod
from ddlcourse.data import tokens
from ddlcourse.device import rank_device
from ddlcourse.models import transformer as T
from ddlcourse.models.transformer import causal_attention
from ddlcourse.parallel import traffic
from ddlcourse.parallel.context import LAYOUTS, positions, ring_attention, shard


def compare_attention(batch: int = 2, heads: int = 2, seq_len: int = 32, head_dim: int = 8,
                      layout: str = "zigzag", group=None, seed: int = 0, device=None) -> dict:
    """Ring attention on this rank's shard against full causal attention, forward and backward (max |diff|)."""
    device = rank_device(device)
    r, cp = tdist.get_rank(group), tdist.get_world_size(group)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=torch.float64).to(device)
               for _ in range(3))
    w = torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=torch.float64).to(device)
    for t in (q, k, v):
        t.requires_grad_(True)
    full = causal_attention(q, k, v)
    (full * w).sum().backward()
    ref = [full.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]

    pos = positions(r, cp, seq_len, layout).to(device)
    ql, kl, vl = (shard(t.detach(), r, cp, layout, dim=2).requires_grad_(True) for t in (q, k, v))
    stats = {}
    out = ring_attention(ql, kl, vl, pos, pos, group=group, stats=stats)
    (out * shard(w, r, cp, layout, dim=2)).sum().backward()
    mine = [out.detach(), ql.grad, kl.grad, vl.grad]
    diffs = {name: float((a - shard(b, r, cp, layout, dim=2)).abs().max())
             for name, a, b in zip(("out", "dq", "dk", "dv"), mine, ref)}
    return dict(diffs, rank=r, scores=stats.get("scores", 0))


def compare_model(cfg=None, batch: int = 2, layout: str = "zigzag", group=None, seed: int = 0,
                  device=None) -> dict:
    """The whole transformer with context parallelism against serial: loss and every gradient (max |diff|).

    Each rank embeds, normalises and runs the MLPs on its own tokens (by their true positions); attention is
    ring attention; the parameter gradients are summed over the group (each rank saw part of the tokens).
    """
    device = rank_device(device)
    cfg = cfg or T.TransformerConfig(vocab=11, seq_len=16, dim=32, n_heads=4, n_layers=2)
    r, cp = tdist.get_rank(group), tdist.get_world_size(group)
    x, y = tokens.sort_batch(batch, cfg.vocab - 1, cfg.seq_len // 2, seed=seed, device=device)
    n_targets = int((y != -100).sum())

    serial = T.build(cfg, seed=seed, device=device)
    loss_ref = T.lm_loss(serial(x), y, reduction="sum") / n_targets
    loss_ref.backward()

    model = T.build(cfg, seed=seed, device=device)
    model.set_attn_fn(partial(ring_attention, group=group))
    pos = positions(r, cp, cfg.seq_len, layout).to(device)
    loss_local = T.lm_loss(model(shard(x, r, cp, layout), pos), shard(y, r, cp, layout), reduction="sum") / n_targets
    loss_local.backward()
    loss = loss_local.detach().clone()
    tdist.all_reduce(loss, group=group)
    grad_diff = 0.0
    for p, q in zip(model.parameters(), serial.parameters()):
        g = p.grad.clone()
        tdist.all_reduce(g, group=group)
        grad_diff = max(grad_diff, float((g - q.grad).abs().max()))
    return dict(loss_diff=abs(float(loss) - float(loss_ref.detach())), grad_diff=grad_diff, rank=r)


def time_per_rank(batch: int = 1, heads: int = 4, seq_len: int = 1024, head_dim: int = 32, repeats: int = 3,
                  group=None, seed: int = 0, device=None) -> dict:
    """Forward ring attention with both layouts; per layout this rank's scores computed and compute seconds
    (the best of ``repeats``)."""
    device = rank_device(device)
    r, cp = tdist.get_rank(group), tdist.get_world_size(group)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_len, head_dim, generator=g).to(device)
    out = {}
    for layout in LAYOUTS:
        ql = shard(q, r, cp, layout, dim=2)
        pos = positions(r, cp, seq_len, layout).to(device)
        best = None
        with torch.no_grad():
            for _ in range(repeats):
                stats = {}
                ring_attention(ql, ql, ql, pos, pos, group=group, stats=stats)
                best = stats if best is None or stats["compute_s"] < best["compute_s"] else best
        out[layout] = best
    return dict(out, rank=r)


def measure_block(cfg=None, batch: int = 2, layout: str = "zigzag", group=None, seed: int = 0, device=None) -> dict:
    """One transformer block with ring attention on this rank's tokens: the bytes autograd keeps (forward) and
    the bytes this rank sends (forward + backward), to set against :mod:`ddlcourse.layout`."""
    device = rank_device(device)
    cfg = cfg or T.TransformerConfig(vocab=11, seq_len=64, dim=32, n_heads=4, n_layers=1)
    r, cp = tdist.get_rank(group), tdist.get_world_size(group)
    torch.manual_seed(seed)
    block = T.Block(cfg).to(device)
    if cp > 1:   # one rank is no context parallelism: the serial attention (the ring would skip the future block)
        block.attn.attn_fn = partial(ring_attention, group=group)
    pos = positions(r, cp, cfg.seq_len, layout).to(device)
    x = torch.randn(batch, len(pos), cfg.dim, device=device, requires_grad=True)
    with traffic.counting() as sent:
        with lay_mod.saved_activations(block) as saved:
            y = block(x, pos)
        y.sum().backward()
    return dict(rank=r, saved=saved.bytes, sent=sent["ring"])


def train(cfg, steps: int, batch: int, lr: float = 3e-3, layout: str = "zigzag", group=None, seed: int = 0,
          device=None, serial: bool = False) -> dict:
    """Train on the sort task with context parallelism: the same data, initialisation and optimizer as
    :func:`ddlcourse.models.transformer.train_sort`, each rank holding its share of every sequence.
    Returns the loss curve (the loss of the whole batch, the same on every rank).

    With ``serial``, rank 0 of ``group`` also trains the serial reference, ``train_sort``, on its own device
    (the device the ranks train on), returned as ``serial`` (``losses``, ``test_accuracy``; ``None`` on the
    other ranks)."""
    device = rank_device(device)
    r, cp = tdist.get_rank(group), tdist.get_world_size(group)
    n_symbols, length = cfg.vocab - 1, cfg.seq_len // 2
    model = T.build(cfg, seed=seed, device=device)
    model.set_attn_fn(partial(ring_attention, group=group))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pos = positions(r, cp, cfg.seq_len, layout).to(device)
    losses = []
    for step in range(steps):
        x, y = tokens.sort_batch(batch, n_symbols, length, seed=seed + 1, start=step * batch, device=device)
        n_targets = int((y != -100).sum())
        loss = T.lm_loss(model(shard(x, r, cp, layout), pos), shard(y, r, cp, layout), reduction="sum") / n_targets
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()] + [loss.detach().reshape(1)])
        tdist.all_reduce(flat, group=group)              # each rank saw part of every sequence: sum
        i = 0
        for p in model.parameters():
            p.grad.copy_(flat[i:i + p.numel()].view_as(p))
            i += p.numel()
        opt.step()
        losses.append(float(flat[-1]))
    ref = None
    if serial and r == 0:
        ref = T.train_sort(cfg, steps=steps, batch=batch, lr=lr, seed=seed, device=device)
        ref = dict(losses=ref["losses"], test_accuracy=ref["test_accuracy"])   # the model stays on the rank
    return dict(losses=losses, rank=r, serial=ref)
