"""Mixed precision done right: bf16 autocast, fp16 with loss scaling, fp32 master weights, and data parallelism.

Three things that are often mixed up, kept apart here:

* **autocast** (``torch.autocast(device_type, dtype)``) runs chosen ops (matrix products, convolutions) in
  bf16 or fp16 and keeps the **parameters in fp32**. The half-precision copies of the weights are made per
  op; autograd keeps them for backward and they are freed with the iteration's graph. Gradients land in
  ``param.grad`` in fp32. There are no separate "master weights":
  the fp32 parameters are the only ones.
* **loss scaling** (``torch.amp.GradScaler``) is needed with fp16 (5 exponent bits: the smallest positive
  fp16 number is 2**-24, about 6e-8), not with bf16 (8 exponent bits, fp32's range). Backward runs in fp16
  where autocast ran the forward in fp16, so activation gradients below 6e-8 become 0. Multiplying the loss
  by ``S`` multiplies every gradient by ``S``; they are divided by ``S`` in fp32 before the optimizer step,
  and a step whose gradients overflowed (inf/nan) is skipped and ``S`` halved (:func:`update_scale`).
* **fp32 master weights** exist where the *model itself* is stored in fp16 (``model.half()``, the Apex "O2"
  recipe, DeepSpeed/Megatron fp16 and bf16 optimizers): the optimizer keeps an fp32 copy of every parameter,
  steps that copy, and writes it back rounded into the fp16 model (:class:`MasterWeightsOptimizer`). Without
  it, an update smaller than half the spacing of fp16 numbers near the weight is rounded away
  (:func:`lost_update`).

Every function takes a ``device`` (default: the rank's, :func:`ddlcourse.device.rank_device`); autocast and
the scaler use that device's type, so the same code runs on CPU ranks here and on GPUs.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.parallel import DistributedDataParallel as DDP

from ddlcourse.device import rank_device

FP16_SMALLEST = 2.0 ** -24          # smallest positive (subnormal) fp16 number, about 6e-8
MODES = ("fp32", "bf16", "fp16", "fp16+scaler")


# --------------------------------------------------------------------------- what fp16 and bf16 can hold
def underflow_fraction(t: torch.Tensor, dtype=torch.float16) -> float:
    """Fraction of the non-zero entries of ``t`` that become exactly 0 when cast to ``dtype``."""
    nz = t[t != 0]
    if nz.numel() == 0:
        return 0.0
    return float((nz.to(dtype) == 0).float().mean())


def lost_update(weight: float, update: float, dtype=torch.float16) -> bool:
    """True when ``weight + update`` stored in ``dtype`` is still ``weight``: the update was rounded away."""
    w = torch.tensor(weight, dtype=dtype)
    return bool((w + torch.tensor(update, dtype=dtype)) == w)


def spacing(x: float, dtype=torch.float16) -> float:
    """The distance from ``x`` to the next larger number of ``dtype`` (its "ulp")."""
    t = torch.tensor(x, dtype=dtype)
    return float(torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)) - t)


# --------------------------------------------------------------------------- the dynamic loss scale
def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """One update of a dynamic loss scale; returns ``(scale, growth_tracker)``.

    ``growth_tracker`` counts the clean steps (finite gradients) since the last change. An overflow
    multiplies the scale by ``backoff_factor`` and restarts the count; ``growth_interval`` clean steps in a
    row multiply it by ``growth_factor`` and restart the count. This is the rule of
    ``torch.amp.GradScaler.update`` (``torch._amp_update_scale_``).
    """
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker


def scale_trajectory(found_infs, fn=update_scale, init_scale: float = 2.0 ** 16, **kw) -> list[float]:
    """The scale after each step for a sequence of overflow flags, using ``fn`` as the update rule."""
    scale, tracker, out = float(init_scale), 0, []
    for inf in found_infs:
        scale, tracker = fn(scale, tracker, bool(inf), **kw)
        out.append(float(scale))
    return out


def _grads_finite(params) -> bool:
    return all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)


class MasterWeightsOptimizer:
    """fp16 model, fp32 master copies, a dynamic loss scale: fp16 training as Apex O2 / DeepSpeed do it.

    ``opt = MasterWeightsOptimizer(model_fp16, torch.optim.SGD, lr=0.1)``; per step::

        opt.zero_grad(); opt.backward(loss); opt.step()

    ``backward`` multiplies the loss by the scale; ``step`` copies the fp16 gradients into fp32, divides them by
    the scale, skips the step if any is inf/nan, steps the fp32 masters, and writes them back into the fp16
    model. ``master=False`` steps the fp16 weights directly (no fp32 copies) to show what they are for.
    """

    def __init__(self, model: nn.Module, optim_cls=torch.optim.SGD, master: bool = True, init_scale: float = 2.0 ** 16,
                 growth_interval: int = 2000, **optim_kwargs):
        self.model_params = [p for p in model.parameters() if p.requires_grad]
        self.master = master
        if master:
            self.master_params = [p.detach().float().clone().requires_grad_(True) for p in self.model_params]
        else:
            self.master_params = self.model_params
        self.optimizer = optim_cls(self.master_params, **optim_kwargs)
        self.scale, self.tracker, self.growth_interval = float(init_scale), 0, growth_interval
        self.skipped = 0

    def zero_grad(self) -> None:
        for p in self.model_params + (self.master_params if self.master else []):
            p.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        (loss.float() * self.scale).backward()

    def step(self) -> bool:
        """Returns False when the step was skipped (an overflow)."""
        found_inf = not _grads_finite(self.model_params)
        if not found_inf:
            for mp, p in zip(self.master_params, self.model_params):
                g = p.grad.float() / self.scale                   # unscale in fp32
                mp.grad = g if self.master else g.to(p.dtype)
            self.optimizer.step()
            if self.master:
                with torch.no_grad():
                    for mp, p in zip(self.master_params, self.model_params):
                        p.copy_(mp)                               # rounded to fp16 once per step
        else:
            self.skipped += 1
        self.scale, self.tracker = update_scale(self.scale, self.tracker, found_inf,
                                                growth_interval=self.growth_interval)
        return not found_inf


# --------------------------------------------------------------------------- a run that fp16 loses
def make_problem(n: int = 4096, dim: int = 16, target_scale: float = 1e-5, seed: int = 0, device=None):
    """A regression whose outputs are small: ``y = target_scale * tanh(x w)``, ``x ~ N(0, 1)``.

    With the loss averaged over ``n`` samples, the gradient of each output is ``2 r / n``: about
    ``target_scale / n``, below fp16's smallest number for the default sizes.
    """
    device = rank_device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    return x.to(device), (target_scale * torch.tanh(x @ w)).to(device)


def make_model(dim: int = 16, hidden: int = 32, out_scale: float = 1e-4, seed: int = 1, device=None) -> nn.Module:
    """An MLP whose last layer starts ``out_scale`` times smaller (its outputs on the scale of the targets)."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, 1, bias=False))
    with torch.no_grad():
        m[2].weight.mul_(out_scale)
    return m.to(rank_device(device))


def _autocast(mode: str, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp16+scaler": torch.float16}.get(mode)
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def train(mode: str, steps: int = 30, lr: float = 0.5, n: int = 4096, dim: int = 16, hidden: int = 16,
          target_scale: float = 1e-5, init_scale: float = 2.0 ** 16, growth_interval: int = 10, seed: int = 0,
          device=None) -> dict:
    """Train :func:`make_model` on :func:`make_problem` with SGD in one of :data:`MODES`.

    SGD, not Adam: Adam divides each gradient by its own size, which hides a gradient's scale (and would
    step tiny weights by ``lr``); with SGD the step is the gradient, as in the analysis of loss scaling.

    Returns ``{"losses", "zero_grad_fraction" (per step, of the last layer's gradient), "scales"}``. The loss is
    computed in fp32 in every mode (``out.float()``); only the model's ops run in bf16/fp16.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")
    device = rank_device(device)
    x, y = make_problem(n, dim, target_scale, seed, device)
    model = make_model(dim, hidden, out_scale=target_scale / 0.3, seed=seed + 1, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = (torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)
              if mode == "fp16+scaler" else None)
    losses, zeros, scales = [], [], []
    last = model[2].weight     # its gradient is proportional to the output gradients (the first layer's: their square)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with _autocast(mode, device):
            out = model(x)
        loss = ((out.float() - y) ** 2).mean()
        losses.append(loss.item())
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()        # NEW: loss x S, so every gradient x S (no underflow)
        zeros.append(float((last.grad == 0).float().mean()))
        if scaler is None:
            opt.step()
        else:
            scales.append(float(scaler.get_scale()))
            scaler.step(opt)                     # NEW: unscale in fp32; skip the step on inf/nan
            scaler.update()                      # NEW: S x 2 after growth_interval clean steps, S / 2 on overflow
    return {"losses": losses, "zero_grad_fraction": zeros, "scales": scales}


def compare_modes(modes=MODES, **kw) -> dict:
    """:func:`train` in each mode, same data and initial weights."""
    return {m: train(m, **kw) for m in modes}


def recovered(runs: dict, lost_if_above: float = 0.5, tol: float = 0.05) -> dict:
    """Did plain fp16 lose the run, and did the scaler recover it?

    fp16 *lost* it when its final loss is still above ``lost_if_above`` of the first loss while fp32's went
    below that; the scaler *recovered* it when its final loss is within ``tol`` (relative) of fp32's.
    """
    first = runs["fp32"]["losses"][0]
    f32 = runs["fp32"]["losses"][-1]
    lost = f32 < lost_if_above * first and runs["fp16"]["losses"][-1] > lost_if_above * first
    rec = abs(runs["fp16+scaler"]["losses"][-1] - f32) <= tol * f32
    return {"fp16_lost": lost, "scaler_recovered": rec, "both": lost and rec}


# --------------------------------------------------------------------------- why master weights
def train_half_model(master: bool, steps: int = 40, lr: float = 0.05, n: int = 256, dim: int = 16, hidden: int = 32,
                     seed: int = 0, device=None) -> list[float]:
    """SGD on an fp16 model (``model.half()``), with or without fp32 master weights; the loss per step.

    The targets are of size 1 here (no underflow problem); what differs is only where the update is added.
    """
    device = rank_device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=g))
    x, y = x.to(device), y.to(device)
    model = make_model(dim, hidden, out_scale=1.0, seed=seed + 1, device=device).half()
    opt = MasterWeightsOptimizer(model, torch.optim.SGD, master=master, lr=lr, init_scale=2.0 ** 10)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x.half()).float() - y) ** 2).mean()
        losses.append(loss.item())
        opt.backward(loss)
        opt.step()
    return losses


def train_fp32_reference(steps: int = 40, lr: float = 0.05, n: int = 256, dim: int = 16, hidden: int = 32,
                         seed: int = 0, device=None) -> list[float]:
    """The same SGD run as :func:`train_half_model`, all in fp32."""
    device = rank_device(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=g))
    x, y = x.to(device), y.to(device)
    model = make_model(dim, hidden, out_scale=1.0, seed=seed + 1, device=device).half().float()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return losses


def accumulate(weight: float = 1.0, update: float = -1e-4, steps: int = 1000, master: bool = True) -> list[float]:
    """Add ``update`` to an fp16 weight ``steps`` times, through an fp32 master copy or directly; the fp16 weight per step.

    Near 1.0 fp16 numbers are 2**-10 apart: an update of 1e-4 is less than half of that and, added to the
    fp16 weight directly, is rounded away every time. The fp32 master accumulates it.
    """
    w16 = torch.tensor(weight, dtype=torch.float16)
    w32 = torch.tensor(weight, dtype=torch.float32)
    u = torch.tensor(update, dtype=torch.float32)
    out = []
    for _ in range(steps):
        if master:
            w32 += u
            w16 = w32.to(torch.float16)
        else:
            w16 = w16 + u.to(torch.float16)
        out.append(float(w16))
    return out


def bytes_per_param(recipe: str) -> dict:
    """Bytes per parameter held for training with Adam, by part (activations not counted).

    ``fp32``: 4 weights + 4 gradients + 8 Adam moments. ``autocast``: the same (fp32 parameters and
    gradients; only activations and per-op weight copies are in half precision). ``fp16-master``: 2 fp16
    weights + 2 fp16 gradients + 4 fp32 masters + 8 Adam moments (Micikevicius et al., 2018).
    """
    table = {
        "fp32": {"weights": 4, "grads": 4, "master": 0, "adam": 8},
        "autocast": {"weights": 4, "grads": 4, "master": 0, "adam": 8},
        "fp16-master": {"weights": 2, "grads": 2, "master": 4, "adam": 8},
    }
    if recipe not in table:
        raise ValueError(f"unknown recipe {recipe!r}; use one of {sorted(table)}")
    return table[recipe]


# --------------------------------------------------------------------------- data parallelism with mixed precision
def compress_hook(dtype):
    """A DDP comm hook that all-reduces each gradient bucket in ``dtype`` and records the dtype it sent.

    What ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook`` does for fp16:
    divide by the world size, cast, all-reduce, cast back into the fp32 bucket. The dtypes sent are kept in
    ``hook.sent``. Register it with DDP's process group as the state (``ddp.register_comm_hook(group, hook)``):
    the bucket is reduced over that group, not the whole world.
    """
    def hook(group, bucket):
        buf = bucket.buffer()
        wire = (buf / tdist.get_world_size(group)).to(dtype)
        hook.sent.append(str(wire.dtype).replace("torch.", ""))
        fut = tdist.all_reduce(wire, group=group, async_op=True).get_future()

        def back(f):
            buf.copy_(f.value()[0])
            return buf
        return fut.then(back)
    hook.sent = []
    return hook


DP_WAYS = {  # name: (autocast dtype, dtype on the wire, loss scaler?)
    "bf16 autocast, fp32 allreduce": (torch.bfloat16, torch.float32, False),
    "bf16 autocast, fp16 allreduce": (torch.bfloat16, torch.float16, False),
    "fp16 autocast + scaler, fp16 allreduce": (torch.float16, torch.float16, True),
}


def dp_mixed_precision(steps: int = 3, global_batch: int = 4096, dim: int = 16, hidden: int = 16, lr: float = 0.5,
                       target_scale: float = 1e-5, init_scale: float = 2.0 ** 24, group=None, device=None) -> dict:
    """On every rank: DDP with autocast, its gradient buckets all-reduced in fp32 or in fp16 (:data:`DP_WAYS`).

    Each way trains ``steps`` SGD steps on :func:`make_problem` (the small-gradient case). Returned per way:
    the dtype the hook sent, the dtype of ``param.grad``, the losses, and how far the first step's
    all-reduced, unscaled gradient is from the serial fp32 gradient of the global batch (``grad_rel_diff``),
    with the fraction of its entries that are 0 (the first layer's gradients are about 1e-10 here: below
    fp16's range unless scaled).
    """
    device = rank_device(device)
    r, n = tdist.get_rank(group), tdist.get_world_size(group)
    if global_batch % n:
        raise ValueError(f"global_batch {global_batch} must divide evenly over {n} ranks")
    x, y = make_problem(global_batch, dim, target_scale, 0, device)
    per = global_batch // n
    xs, ys = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]
    serial = make_model(dim, hidden, out_scale=target_scale / 0.3, seed=1, device=device)
    ((serial(x) - y) ** 2).mean().backward()
    ref = torch.cat([p.grad.flatten() for p in serial.parameters()])
    out = {}
    for way, (amp_dtype, wire, scaled) in DP_WAYS.items():
        model = make_model(dim, hidden, out_scale=target_scale / 0.3, seed=1, device=device)
        ddp = DDP(model, process_group=group)
        hook = compress_hook(wire)
        ddp.register_comm_hook(group, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=scaled)
        losses, grad = [], None
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype):
                o = ddp(xs)
            loss = ((o.float() - ys) ** 2).mean()
            mean_loss = loss.detach().clone()
            tdist.all_reduce(mean_loss, group=group)
            losses.append(float(mean_loss) / n)
            scaler.scale(loss).backward()
            if grad is None:   # the first step's all-reduced gradient, unscaled
                grad = torch.cat([p.grad.flatten() for p in model.parameters()]) / scaler.get_scale()
            scaler.step(opt)
            scaler.update()
        out[way] = {"sent": sorted(set(hook.sent)),
                    "param_grad_dtype": str(model[2].weight.grad.dtype).replace("torch.", ""),
                    "grad_rel_diff": float((grad - ref).norm() / ref.norm()),
                    "zero_grad_fraction": float((grad == 0).float().mean()), "losses": losses}
    return out


# --------------------------------------------------------------------------- the scaler with sharded gradients
def sharded_scaler(steps: int = 6, overflow_step: int = 3, overflow_rank: int = 1, init_scale: float = 2.0 ** 10,
                   group=None, device=None) -> dict:
    """On every rank of ``group``: each rank holds its own shard of a model (a different parameter, as under ZeRO,
    FSDP or tensor parallelism) and steps it with a dynamic loss scaler; at ``overflow_step`` only
    ``overflow_rank``'s gradients overflow. Two scalers, per rank:

    * ``GradScaler``: ``torch.amp.GradScaler`` looks for inf/nan in *this rank's* gradients only, so the rank
      that overflowed skips the step and halves its scale while the others step on: the shards now belong to
      different optimizer steps and the ranks' scales disagree from then on;
    * ``ShardedGradScaler``: torch's scaler for FSDP, which all-reduces ``found_inf`` over the group
      (``torch.distributed.fsdp.sharded_grad_scaler``), so every rank skips the same step.

    Returned per scaler: ``taken`` (per step, whether this rank's shard was updated) and ``scales`` (after each step).
    """
    device = rank_device(device)
    r = tdist.get_rank(group)
    if not 0 <= overflow_step < steps:
        raise ValueError(f"overflow_step {overflow_step} is not one of the {steps} steps")
    out = {}
    for name in ("GradScaler", "ShardedGradScaler"):
        shard = nn.Parameter(torch.randn(8, generator=torch.Generator().manual_seed(r)).to(device))
        opt = torch.optim.SGD([shard], lr=0.01)
        scaler = (torch.amp.GradScaler(device.type, init_scale=init_scale) if name == "GradScaler" else
                  ShardedGradScaler(device=device.type, init_scale=init_scale, process_group=group))
        taken, scales = [], []
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            blow_up = 1e36 if (step == overflow_step and r == overflow_rank) else 1.0   # x scale: inf in fp32
            loss = (shard * shard).sum() * blow_up
            scaler.scale(loss).backward()
            before = shard.detach().clone()
            scaler.step(opt)
            scaler.update()
            taken.append(not torch.equal(before, shard.detach()))
            scales.append(float(scaler.get_scale()))
        out[name] = {"taken": taken, "scales": scales}
    return out


# --------------------------------------------------------------------------- plot
def plot_runs(runs: dict, ax=None):
    """Loss per step of each mode (log scale) and, on a second axis, the loss scale of the scaler run."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    styles = {"fp32": "k-", "bf16": "g--", "fp16": "r-", "fp16+scaler": "b:"}
    for mode, run in runs.items():
        ax.semilogy(run["losses"], styles.get(mode, "-"), label=mode)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    sc = next((r["scales"] for r in runs.values() if r.get("scales")), None)
    if sc:
        ax2 = ax.twinx()
        ax2.semilogy(sc, color="grey", lw=0.8, alpha=0.6)
        ax2.set_ylabel("loss scale (grey)", fontsize=8)
    ax.legend(fontsize=7, loc="lower left")
    return ax
