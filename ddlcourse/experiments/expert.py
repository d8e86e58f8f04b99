"""Notebook 22 · the expert-parallel MoE (:mod:`ddlcourse.parallel.expert`) against serial, capacity, and its
all_to_all traffic."""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ddlcourse.device import rank_device
from ddlcourse.models.transformer import MoE, expert_capacity
from ddlcourse.parallel import traffic
from ddlcourse.parallel.expert import ExpertParallelMoE, _grad


def make_moe(dim: int = 16, hidden: int = 32, n_experts: int = 4, top_k: int = 2, capacity_factor: float = 1.25,
             n_groups: int = 1, seed: int = 0, device=None) -> MoE:
    torch.manual_seed(seed)
    return MoE(dim, hidden, n_experts, top_k, capacity_factor, n_groups).to(rank_device(device))


def skewed_tokens(n: int, dim: int, seed: int = 0, skew: float = 1.0, device=None) -> torch.Tensor:
    """``n`` random token vectors with a common offset of size ``skew``: the router then prefers some
    experts, as a real one does early in training (0: no preference)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g) + skew * torch.randn(1, dim, generator=g)
    return x.to(rank_device(device))


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| relative to max |ref| (the absolute difference when ref is all zeros)."""
    scale = float(ref.abs().max())
    return float((a - ref).abs().max()) / (scale if scale > 0 else 1.0)


def compare_with_serial(tokens_per_rank: int = 24, dim: int = 16, hidden: int = 32, experts_per_rank: int = 2,
                        top_k: int = 2, capacity_factor: float = 1.0, skew: float = 1.0, group=None, seed: int = 0,
                        device=None) -> dict:
    """Expert-parallel MoE on this rank's tokens against the serial MoE with one routing group per rank:
    outputs, load-balancing loss and every gradient, each as max |diff| / max |serial| (float32 sums in
    another order differ by rounding relative to the values' size), plus this rank's routing stats."""
    device = rank_device(device)
    ep, r = tdist.get_world_size(group), tdist.get_rank(group)
    serial = make_moe(dim, hidden, experts_per_rank * ep, top_k, capacity_factor, n_groups=ep, seed=seed,
                      device=device)
    x = skewed_tokens(tokens_per_rank * ep, dim, seed=seed + 1, skew=skew, device=device)
    w = skewed_tokens(tokens_per_rank * ep, dim, seed=seed + 2, skew=0.0, device=device)
    y_ref = serial(x)
    ((y_ref * w).sum() + serial.aux).backward()

    moe = ExpertParallelMoE(serial, group)
    moe.zero_grad()
    mine = slice(r * tokens_per_rank, (r + 1) * tokens_per_rank)
    y = moe(x[mine])
    ((y * w[mine]).sum() + moe.aux / ep).backward()      # the serial aux is the mean over the ep groups
    aux = moe.aux.detach().clone() / ep
    tdist.all_reduce(aux, group=group)
    g_router = moe.router.weight.grad.clone()
    tdist.all_reduce(g_router, group=group)               # replicated router: each rank saw part of the tokens
    expert_diff = max(_rel(_grad(p), _grad(q))
                      for j, ex in enumerate(moe.experts)
                      for p, q in zip(ex.parameters(), serial.experts[r * experts_per_rank + j].parameters()))
    return dict(out=_rel(y.detach(), y_ref[mine].detach()), aux=_rel(aux, serial.aux.detach()),
                router_grad=_rel(g_router, serial.router.weight.grad), expert_grad=expert_diff,
                rank=r, load=moe.stats["load"], dropped=moe.stats["dropped"],
                assignments=moe.stats["assignments"])


def capacity_sweep(capacity_factors, n_tokens: int = 512, dim: int = 16, hidden: int = 32, n_experts: int = 8,
                   top_k: int = 2, skew: float = 1.0, seed: int = 0, device=None) -> list[dict]:
    """Serial MoE routing of the same tokens at several capacity factors: dropped share and load per expert."""
    out = []
    x = skewed_tokens(n_tokens, dim, seed=seed + 1, skew=skew, device=device)
    for cf in capacity_factors:
        moe = make_moe(dim, hidden, n_experts, top_k, cf, seed=seed, device=device)
        with torch.no_grad():
            moe(x)
        s = moe.stats
        out.append(dict(capacity_factor=cf, dropped_share=s["dropped"] / s["assignments"], load=s["load"],
                        capacity=expert_capacity(n_tokens, n_experts, top_k, cf), aux=float(moe.aux)))
    return out


def measure_traffic(tokens_per_rank: int = 256, dim: int = 16, hidden: int = 32, experts_per_rank: int = 2,
                    top_k: int = 2, capacity_factor: float = 2.0, skew: float = 0.0, group=None, seed: int = 0,
                    device=None) -> dict:
    """Bytes this rank sends in the all_to_all exchanges of one MoE forward + backward, with its routing stats."""
    device = rank_device(device)
    ep, r = tdist.get_world_size(group), tdist.get_rank(group)
    moe = ExpertParallelMoE(make_moe(dim, hidden, experts_per_rank * ep, top_k, capacity_factor, seed=seed,
                                     device=device), group)
    x = skewed_tokens(tokens_per_rank * ep, dim, seed=seed + 1, skew=skew, device=device)
    mine = x[r * tokens_per_rank:(r + 1) * tokens_per_rank].clone().requires_grad_(True)   # an activation: its
    with traffic.counting() as sent:                                                       # gradient goes back too
        moe(mine).sum().backward()
    return dict(rank=r, sent=sent["all_to_all"], dropped=moe.stats["dropped"],
                assignments=moe.stats["assignments"], load=moe.stats["load"],
                expert_params=sum(p.numel() for p in moe.experts.parameters()))
