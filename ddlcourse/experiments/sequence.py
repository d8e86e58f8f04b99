"""Notebooks 20 and 30 · tensor and sequence parallel transformer blocks (:mod:`ddlcourse.parallel.sequence`)
against serial: gradients, clipping, activation memory, training."""
from __future__ import annotations

import copy

import torch
import torch.distributed as tdist

from ddlcourse import layout as lay_mod
from ddlcourse.data import tokens
from ddlcourse.device import rank_device
from ddlcourse.models import transformer as T
from ddlcourse.parallel import traffic
from ddlcourse.parallel.sequence import TensorParallelBlock, TensorParallelTransformer, _size_rank, clip_grad_norm_tp, dtensor_block, sync_sequence_parallel_grads


def clipping_on_shards(cfg=None, batch: int = 2, clip_fraction: float = 0.1, group=None, seed: int = 0,
                       device=None) -> dict:
    """On every rank of ``group``: clip a tensor + sequence parallel block's gradients three ways and compare each
    with serial clipping (``torch.nn.utils.clip_grad_norm_`` on the serial block, ``max_norm`` = ``clip_fraction``
    of its norm, so clipping is active):

    * ``local``: ``clip_grad_norm_`` on this rank's parameters, as one would on a plain module: each rank sees
      its own norm and scales by its own factor;
    * ``summed``: the squared norms of *all* this rank's parameters summed over the ranks: the replicated ones
      are counted ``t`` times;
    * ``right``: :func:`clip_grad_norm_tp`.

    Returned: the serial norm and, per way, the norm this rank used and max |clipped grad - serial clipped grad|.
    """
    device = rank_device(device)
    t, r, cfg, block, pos, x, w = _serial_block(cfg, batch, group, seed, device)
    mine = slice(r * cfg.seq_len // t, (r + 1) * cfg.seq_len // t)
    serial = copy.deepcopy(block)
    (serial(x, pos) * w).sum().backward()
    serial_norm = torch.nn.utils.clip_grad_norm_(serial.parameters(), float("inf"))
    max_norm = clip_fraction * float(serial_norm)
    torch.nn.utils.clip_grad_norm_(serial.parameters(), max_norm)

    def summed(par):
        sq = torch.stack([p.grad.double().square().sum() for p in par.parameters()]).sum()
        tdist.all_reduce(sq, group=group)
        norm = sq.sqrt()
        for p in par.parameters():
            p.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0).to(p.grad.dtype))
        return norm

    ways = {"local": lambda par: torch.nn.utils.clip_grad_norm_(par.parameters(), max_norm), "summed": summed,
            "right": lambda par: clip_grad_norm_tp(par, max_norm, group)}
    out = {"serial_norm": float(serial_norm), "max_norm": max_norm}
    for name, clip in ways.items():
        par = TensorParallelBlock(block, group, sp=True)
        (par(x[:, mine].clone(), pos) * w[:, mine]).sum().backward()
        sync_sequence_parallel_grads(par, group)
        norm = clip(par)
        out[name] = dict(norm=float(norm), grad_diff=_grad_diffs(par, serial, r, t, lambda p: p.grad))
    return out


def _inputs(cfg, batch, seed, device):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, cfg.seq_len, cfg.dim, generator=g).to(device)
    w = torch.randn(batch, cfg.seq_len, cfg.dim, generator=g).to(device)       # weights of a test loss
    return x, w


def _serial_block(cfg, batch, group, seed, device):
    """``(t, r, cfg, block, pos, x, w)``: this rank's place in ``group``, the config (a small default), a serial
    block seeded by ``seed`` on the rank's device, the positions, an input batch and the weights of a test loss."""
    device = rank_device(device)
    t, r = _size_rank(group)
    cfg = cfg or T.TransformerConfig(vocab=11, seq_len=16, dim=32, n_heads=4, n_layers=1)
    torch.manual_seed(seed)
    block = T.Block(cfg).to(device)
    x, w = _inputs(cfg, batch, seed, device)
    return t, r, cfg, block, torch.arange(cfg.seq_len, device=device), x, w


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _grad_diffs(par, serial_block, r, t, full_grad):
    """max |grad diff| between this rank's shards and the matching slices of the serial gradients."""
    sa, sm = serial_block.attn, serial_block.mlp
    k_a, k_m = sa.wq.out_features // t, sm.fc1.out_features // t
    pairs = [(par.ln1.weight, serial_block.ln1.weight.grad), (par.ln1.bias, serial_block.ln1.bias.grad),
             (par.ln2.weight, serial_block.ln2.weight.grad), (par.ln2.bias, serial_block.ln2.bias.grad)]
    for name in ("wq", "wk", "wv"):
        pairs += [(getattr(par, name).weight, getattr(sa, name).weight.grad[r * k_a:(r + 1) * k_a]),
                  (getattr(par, name).bias, getattr(sa, name).bias.grad[r * k_a:(r + 1) * k_a])]
    pairs += [(par.wo.weight, sa.wo.weight.grad[:, r * k_a:(r + 1) * k_a]), (par.wo_bias, sa.wo.bias.grad),
              (par.fc1.weight, sm.fc1.weight.grad[r * k_m:(r + 1) * k_m]),
              (par.fc1.bias, sm.fc1.bias.grad[r * k_m:(r + 1) * k_m]),
              (par.fc2.weight, sm.fc2.weight.grad[:, r * k_m:(r + 1) * k_m]), (par.fc2_bias, sm.fc2.bias.grad)]
    return max(float((full_grad(p) - ref).abs().max()) for p, ref in pairs)


def compare_with_serial(cfg=None, batch: int = 2, group=None, seed: int = 0, device=None, dtensor: bool = True,
                        n_layers_model: int = 2) -> dict:
    """Run on every rank of ``group``: the serial block against the hand-written TP block, TP + SP block and
    (``dtensor``) the DTensor TP and TP + SP blocks; output, input gradient and every parameter gradient
    (max |diff| to serial); the DTensor blocks also against the hand-written ones; and a whole model
    (``n_layers_model`` blocks, sp on) against the serial model."""
    device = rank_device(device)
    t, r, cfg, block, pos, x, w = _serial_block(cfg, batch, group, seed, device)
    xs = x.clone().requires_grad_(True)
    y_ref = block(xs, pos)
    (y_ref * w).sum().backward()
    mine = slice(r * cfg.seq_len // t, (r + 1) * cfg.seq_len // t)
    out = {"rank": r}
    outputs = {}
    for sp in (False, True):
        par = TensorParallelBlock(block, group, sp)
        xin = (x[:, mine] if sp else x).clone().requires_grad_(True)
        y = par(xin, pos)
        (y * (w[:, mine] if sp else w)).sum().backward()
        if sp:
            sync_sequence_parallel_grads(par, group)
        key = "tp_sp" if sp else "tp"
        outputs[key] = y.detach()
        out[key] = dict(out=float((y - y_ref[:, mine] if sp else y - y_ref).abs().max()),
                        grad_input=float((xin.grad - (xs.grad[:, mine] if sp else xs.grad)).abs().max()),
                        grad_params=_grad_diffs(par, block, r, t, lambda p: p.grad))
    if dtensor:
        from torch.distributed.tensor import DTensor, Shard

        for sp in (False, True):
            mod, mesh = dtensor_block(block, group, sp, device)
            xin = (x[:, mine] if sp else x).clone().requires_grad_(True)
            inp = DTensor.from_local(xin, mesh, [Shard(1)]) if sp else xin
            y = _local(mod(inp, pos))
            (y * (w[:, mine] if sp else w)).sum().backward()
            key = "dtensor_sp" if sp else "dtensor"
            shards = _DTensorShards(mod)
            out[key] = dict(out=float((y - y_ref[:, mine] if sp else y - y_ref).abs().max()),
                            grad_input=float((xin.grad - (xs.grad[:, mine] if sp else xs.grad)).abs().max()),
                            grad_params=_grad_diffs(shards, block, r, t, lambda p: _full_grad_local(p)),
                            vs_hand=float((y.detach() - outputs["tp_sp" if sp else "tp"]).abs().max()))
    # the whole model, sequence parallel, against the serial model
    model = T.build(T.TransformerConfig(**{**cfg.to_dict(), "n_layers": n_layers_model}), seed=seed, device=device)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=torch.Generator().manual_seed(seed + 3))
    idx = idx.to(device)
    tpm = TensorParallelTransformer(model, group, sp=True)
    logits_ref, logits = model(idx), tpm(idx)
    logits_ref.square().mean().backward()
    logits.square().mean().backward()
    tpm.sync_grads()
    emb = float((tpm.tok_emb.weight.grad - model.tok_emb.weight.grad).abs().max())
    out["model_sp"] = dict(out=float((logits - logits_ref).abs().max()), grad_params=max(
        emb, *(_grad_diffs(pb, sb, r, t, lambda p: p.grad) for pb, sb in zip(tpm.blocks, model.blocks))))
    return out


class _DTensorShards:
    """The parameters of a DTensor-parallelised block under the names :func:`_grad_diffs` uses."""
    def __init__(self, mod):
        a, m = mod.attn, mod.mlp
        self.ln1, self.ln2, self.wq, self.wk, self.wv, self.wo, self.fc1 = (mod.ln1, mod.ln2, a.wq, a.wk, a.wv,
                                                                            a.wo, m.fc1)
        self.fc2 = m.fc2
        self.wo_bias, self.fc2_bias = a.wo.bias, m.fc2.bias


def _full_grad_local(p):
    """This rank's shard of a DTensor parameter's gradient (a replicated one: the whole gradient)."""
    g = p.grad
    if hasattr(g, "placements"):
        from torch.distributed.tensor import Replicate

        if any(pl.is_partial() for pl in g.placements):
            g = g.redistribute(g.device_mesh, [Replicate()])
        return g.to_local()
    return g


def measure_block(cfg=None, batch: int = 2, sp: bool = False, group=None, seed: int = 0, device=None) -> dict:
    """One tensor-parallel block on this rank: the bytes autograd keeps (forward) and the bytes this rank sends
    (forward + backward), to set against :func:`ddlcourse.layout.activation_bytes_per_layer` and
    :func:`ddlcourse.layout.comm_per_step`. ``group=None`` and one rank measure the serial block."""
    device = rank_device(device)
    t, r = _size_rank(group)
    cfg = cfg or T.TransformerConfig(vocab=11, seq_len=64, dim=64, n_heads=4, n_layers=1)
    torch.manual_seed(seed)
    block = TensorParallelBlock(T.Block(cfg).to(device), group, sp)
    pos = torch.arange(cfg.seq_len, device=device)
    s_loc = cfg.seq_len // t if sp else cfg.seq_len
    x = torch.randn(batch, s_loc, cfg.dim, device=device, requires_grad=True)   # an activation: grads flow back
    with traffic.counting() as sent:
        with lay_mod.saved_activations(block) as saved:
            y = block(x, pos)
        y.sum().backward()
    return dict(rank=r, sp=sp, saved=saved.bytes, sent=sent["tp"], params=sum(p.numel() for p in block.parameters()))


def activation_sweep(cfg, batch: int, group=None, device=None) -> list[dict]:
    """:func:`measure_block` with and without sequence parallelism on ``group`` (one rank: the serial block)."""
    return [measure_block(cfg, batch, sp, group, device=device) for sp in ((False, True) if _size_rank(group)[0] > 1
                                                                        else (False,))]


def train(cfg, steps: int, batch: int, lr: float = 3e-3, sp: bool = True, group=None, seed: int = 0,
          device=None, serial: bool = False) -> dict:
    """Train on the sort task with tensor (and sequence) parallelism: the same data, initialisation and
    optimizer as :func:`ddlcourse.models.transformer.train_sort`. Returns the loss curve (``losses``).

    With ``serial``, rank 0 of ``group`` also trains the serial reference, ``train_sort``, on its own device
    (the device the ranks train on: a CPU reference against GPU ranks differs by more than the parallelism
    does), returned as ``serial`` (``losses``, ``test_accuracy``; ``None`` on the other ranks)."""
    device = rank_device(device)
    n_symbols, length = cfg.vocab - 1, cfg.seq_len // 2
    model = TensorParallelTransformer(T.build(cfg, seed=seed, device=device), group, sp)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, y = tokens.sort_batch(batch, n_symbols, length, seed=seed + 1, start=step * batch, device=device)
        loss = T.lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        model.sync_grads()
        opt.step()
        losses.append(float(loss.detach()))
    return dict(losses=losses, serial=_serial_reference(cfg, steps, batch, lr, seed, device)
                if serial and _size_rank(group)[1] == 0 else None)


def _serial_reference(cfg, steps, batch, lr, seed, device) -> dict:
    """``train_sort`` on ``device``: its losses and held-out accuracy (not the model: it stays on the rank)."""
    ref = T.train_sort(cfg, steps=steps, batch=batch, lr=lr, seed=seed, device=device)
    return dict(losses=ref["losses"], test_accuracy=ref["test_accuracy"])


def activation_formula(cfg, batch: int, t: int, sp: bool) -> float:
    """The layout calculator's bytes per block and rank for this course's model (fp32)."""
    return lay_mod.activation_bytes_per_layer(lay_mod.Model.from_config(cfg),
                                              lay_mod.Layout(tp=t, sp=sp, micro_batch=batch))
