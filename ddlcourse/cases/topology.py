"""Case study: a U-Net surrogate for topology optimisation, trained data-parallel with several optimizers.

    cfg = topology.Config.make("smoke", optimizer="lamb", global_batch=16)
    result = topology.train(cfg)                                    # on every rank

    mpiexec -n 2 python -m ddlcourse run topology --scale smoke --backend ddp [--fresh] [optimizer=lamb epochs=4]

The data (``ddlcourse.data.topology``) are made in parallel, each rank solving its own chunks with the SIMP
solver, then shared: like ``DistributedSampler``, every rank then reads its slice of each global batch
(:meth:`ddlcourse.training.RunContext.batches`), so the sequence of global batches, and therefore the loss
curve, does not depend on the number of ranks. Config, command line, device, timers, checkpoints and results
come from the course's case skeleton (:mod:`ddlcourse.training`).

Metrics (reduced over ranks from sufficient statistics, never taken from rank 0's shard):
IoU and accuracy of the solid phase (threshold 0.5), the volume-fraction error, and the physics metric:
the compliance of the predicted design, re-solved by finite elements, over the compliance of SIMP's design.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ddlcourse import metrics, training
from ddlcourse.training import setting
from ddlcourse.data import topology as data
from ddlcourse.models.topology import UNet, n_parameters
from ddlcourse.optim import OPTIMIZERS, make_optimizer, scaled_lr, with_warmup
from ddlcourse.physics import simp

CASE = "topology"
LR_RULES = ("none", "linear", "sqrt")


@dataclass(kw_only=True)
class Config(training.CaseConfig):
    """The ``topology`` sizes at a scale, and this lab's run options."""

    CASE: ClassVar[str] = CASE
    SECTION: ClassVar[str] = "topology"
    # data
    ny: int = setting(min=1, help="grid cells down the design domain")
    nx: int = setting(min=1, help="grid cells across the design domain")
    n_train: int = setting(min=1, help="training designs")
    n_val: int = setting(min=1, help="validation designs")
    chunk_size: int = setting(min=1, help="designs per chunk (the unit of the data cache)")
    maxloop: int = setting(min=1, help="SIMP iterations per design")
    resolution: int = setting(1, min=1, help="grid multiplier (2: the fine grid of the resolution transfer)")
    train_seed: int = setting(1, min=0, help="seed of the training designs")
    val_seed: int = setting(2, min=0, help="seed of the validation designs (never overlaps the training ones)")
    # model and optimisation
    width: int = setting(min=1, help="channels of the U-Net's first level")
    depth: int = setting(min=1, help="levels of the U-Net")
    optimizer: str = setting("adam", help=f"one of {', '.join(OPTIMIZERS)}")
    lr: float = setting(above=0, help="the learning rate at base_batch")
    lr_rule: str = setting("none", choices=LR_RULES, help="scale lr with global_batch / base_batch")
    base_batch: int = setting(min=1, help="the batch lr is given for (default: the scale's global batch)")
    warmup_steps: int = setting(0, min=0, help="steps of linear warmup")
    global_batch: int = setting(min=1, help="designs per step, over all ranks")
    epochs: int = setting(min=0, help="passes over the training set (0: evaluate the weights of init_from)")
    target_loss: float = setting(above=0, help="the loss of 'steps to target loss'")
    # run control
    init_from: str | None = setting(None, help="start from the weights of another run (fine-tuning)")
    physics_metric: bool = setting(True, help="re-solve validation designs to score their compliance")
    max_physics: int = setting(64, min=0, help="at most this many validation designs are re-solved")
    use_cache: bool = setting(True, help="keep the solved designs on disk")

    def validate(self) -> None:
        super().validate()
        if self.optimizer.lower() not in OPTIMIZERS:
            raise training.ConfigError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        f = 2 ** self.depth
        if self.ny % f or self.nx % f:
            raise training.ConfigError(f"grid {self.ny}x{self.nx} must be divisible by 2**depth = {f}")
        if self.global_batch > self.n_train:
            raise training.ConfigError(f"global_batch {self.global_batch} is larger than the training set "
                                       f"(n_train={self.n_train})")

    @classmethod
    def scale_defaults(cls, sizes) -> dict:
        """``base_batch`` (of the learning-rate scaling rule) defaults to the scale's global batch."""
        return {**super().scale_defaults(sizes), "base_batch": sizes.global_batch}

    @property
    def shape(self) -> tuple[int, int]:
        return (self.ny * self.resolution, self.nx * self.resolution)

    def data_settings(self, split: str) -> dict:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        n = self.n_train if split == "train" else self.n_val
        seed = self.train_seed if split == "train" else self.val_seed
        return data.make_settings(self.shape, n, seed=seed, chunk_size=self.chunk_size, maxloop=self.maxloop,
                                  base_nx=self.nx)


# --------------------------------------------------------------------------- metrics
def design_stats(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Sufficient statistics of a batch of designs ``(n, *grid)`` in [0, 1]:
    ``[TP, FP, FN, TN of solid (threshold 0.5), sum |volume error|, n designs]``."""
    p, t = pred > 0.5, target > 0.5
    vf_err = np.abs(pred.reshape(len(pred), -1).mean(1) - target.reshape(len(target), -1).mean(1))
    return np.array([(p & t).sum(), (p & ~t).sum(), (~p & t).sum(), (~p & ~t).sum(), vf_err.sum(), len(pred)],
                    dtype=np.float64)


def scores(stats: np.ndarray) -> dict:
    """IoU and accuracy of the solid phase, and the mean volume-fraction error, from summed statistics."""
    tp, fp, fn, tn, vf, n = stats
    return dict(iou=float(tp / max(tp + fp + fn, 1)), accuracy=float((tp + tn) / max(tp + fp + fn + tn, 1)),
                vf_error=float(vf / max(n, 1)))


def compliance_ratios(pred: np.ndarray, params: np.ndarray, c_simp: np.ndarray, shape) -> np.ndarray:
    """Compliance of each predicted design (re-solved, SIMP's p = 3) over the compliance of SIMP's design.

    1 means as stiff as SIMP's design; larger is worse. A design that is not connected to its supports
    gives a huge ratio (void has Emin = 1e-9), so the lab reports the median as well as the mean.
    """
    out = []
    for x, par, c in zip(pred, params, c_simp):
        out.append(simp.compliance(data.problem_from_params(par, shape), x) / c)
    return np.asarray(out)


# --------------------------------------------------------------------------- training
def _batch(d: dict, idx: np.ndarray, ctx) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(d["inputs"][idx])                     # (micro_batch, C, ny, nx)
    y = torch.from_numpy(d["target"][idx]).unsqueeze(1)        # (micro_batch, 1, ny, nx)
    return ctx.to((x, y))


def _lr(cfg: Config) -> float:
    return scaled_lr(cfg.lr, cfg.global_batch, cfg.base_batch, cfg.lr_rule)


def _optimizer(name: str, params, lr: float, step_fn=None):
    if step_fn is not None:
        if name.lower() != "lamb":
            raise ValueError(f"step_fn is a LAMB step: train it with optimizer='lamb', not {name!r}")
        return FunctionOptimizer.of(step_fn)(params, lr=lr)
    return make_optimizer(name, params, lr)


class FunctionOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose update is a plain function, ``step_fn(params, grads, state, lr, betas, eps,
    weight_decay)``: the LAMB step of notebook 12's exercise ``lamb_step``, so the lab trains on the learner's
    own update while the loop, the warmup schedule (it sets ``lr``), the wrappers and the checkpoints see an
    ordinary optimizer. ``state`` is one dict for all parameters; it travels in ``state_dict()["fn_state"]``.
    Build the class for a function with :meth:`of` (a class attribute, so Horovod's subclass keeps it)."""

    step_fn = None

    @classmethod
    def of(cls, step_fn):
        g = getattr(step_fn, "__globals__", None)
        if g is not None and getattr(step_fn, "__module__", None) == "__main__":
            # a function written in a notebook reaches the engines without the notebook's imports
            # (ipyparallel gives it the engine's namespace): give it the modules a LAMB step uses
            import math
            g.setdefault("torch", torch)
            g.setdefault("math", math)
        return type("FunctionOptimizer", (cls,), {"step_fn": staticmethod(step_fn)})

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.fn_state = [{} for _ in self.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group, state in zip(self.param_groups, self.fn_state):
            params = [p for p in group["params"] if p.grad is not None]
            type(self).step_fn(params, [p.grad for p in params], state, group["lr"], tuple(group["betas"]),
                               group["eps"], group["weight_decay"])
        return loss

    def state_dict(self):
        return dict(super().state_dict(), fn_state=self.fn_state)

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        fn_state = state_dict.pop("fn_state", None)
        super().load_state_dict(state_dict)
        if fn_state is not None:
            self.fn_state = fn_state


@torch.no_grad()
def evaluate(model, val: dict, ctx, cfg: Config, mean_design: np.ndarray | None = None) -> dict:
    """Metrics of ``model`` on this rank's validation shard, reduced over the run's ranks."""
    model.eval()
    own = np.arange(ctx.rank, len(val["target"]), ctx.world_size)     # disjoint, nothing missing
    preds, loss_sum = [], 0.0
    for s in range(0, len(own), 16):
        x, y = _batch(val, own[s:s + 16], ctx)
        logits = model(x)
        loss_sum += F.binary_cross_entropy_with_logits(logits, y, reduction="sum").item() / y[0].numel()
        preds.append(ctx.numpy(torch.sigmoid(logits)[:, 0]))
    pred = np.concatenate(preds) if preds else np.zeros((0, *cfg.shape), np.float32)
    target = val["target"][own]
    out = scores(ctx.sum(design_stats(pred, target)))
    out["loss"] = float(ctx.sum(loss_sum) / len(val["target"]))
    if cfg.physics_metric:
        keep = own[own < cfg.max_physics]
        r = compliance_ratios(pred[: len(keep)], val["params"][keep], val["compliance"][keep], cfg.shape)
        allr = metrics.allgather_concat(r, ctx.comm)
        out.update(compliance_ratio_mean=float(allr.mean()), compliance_ratio_median=float(np.median(allr)))
    if mean_design is not None:   # the trivial baseline: the mean design of the training set, for every input
        base = np.broadcast_to(mean_design, target.shape)
        b = scores(ctx.sum(design_stats(base, target)))
        out.update({f"baseline_{k}": v for k, v in b.items()})
        if cfg.physics_metric:
            keep = own[own < cfg.max_physics]
            r = compliance_ratios(base[: len(keep)], val["params"][keep], val["compliance"][keep], cfg.shape)
            out["baseline_compliance_ratio_median"] = float(np.median(metrics.allgather_concat(r, ctx.comm)))
    model.train()
    return out


def train(cfg: Config, progress_file: str | None = None, step_fn=None) -> dict | None:
    """Train (or resume) the surrogate; returns the same result dict on every rank that takes part.

    Rank 0 writes the plain numbers to ``results/topology/result-<run_name>.json``.
    ``step_fn``: a LAMB step written as a function (notebook 12's exercise ``lamb_step``), which replaces the
    library's LAMB (``optimizer="lamb"`` only; see :class:`FunctionOptimizer`).
    """
    ctx = training.setup(cfg, progress_file=progress_file)
    if ctx is None:
        return None
    torch.set_num_threads(1)
    G, n = cfg.global_batch, ctx.world_size
    if G % n:
        raise ValueError(f"global_batch {G} must be divisible by the number of ranks {n}")
    # data: each rank solves its own chunks (cached), then the shards are shared (see module docstring)
    t0 = ctx.now()
    tr = data.gather(cfg.data_settings("train"), ctx.comm, use_cache=cfg.use_cache)
    val = data.gather(cfg.data_settings("val"), ctx.comm, use_cache=cfg.use_cache)
    t_data = ctx.now() - t0
    steps_per_epoch = cfg.n_train // G

    model = ctx.to(UNet(in_ch=tr["inputs"].shape[1], width=cfg.width, depth=cfg.depth, dim=len(cfg.shape)))
    if cfg.init_from:             # another run's weights (never cleared by fresh=True)
        done, _ = training.Checkpointer(training.results_dir(CASE) / "ckpt" / cfg.init_from, ctx).load(model)
        if done == 0:
            raise ValueError(f"init_from={cfg.init_from!r}: that run has no checkpoint; train it first")
    opt = _optimizer(cfg.optimizer, model.parameters(), _lr(cfg), step_fn)
    sched = with_warmup(opt, cfg.warmup_steps)
    ckpt = ctx.checkpointer(CASE, epochs=cfg.epochs)                  # fresh=True clears it
    start_epoch, extra = ckpt.load(model, opt)
    history = list(extra.get("history", []))            # (step, global loss, seconds)
    step = int(extra.get("step", 0))
    for _ in range(step):
        sched.step()
    ddp_model, opt = ctx.wrap(model, opt)

    bar = ctx.progress(max(0, cfg.epochs - start_epoch) * steps_per_epoch, desc=f"{CASE} {cfg.optimizer} G={G}")
    t_train = float(extra.get("seconds", 0.0))
    for epoch in range(start_epoch, cfg.epochs):
        te = ctx.now()
        for idx in ctx.batches(cfg.n_train, G, epoch, drop_last=True):   # my share of each global batch
            x, y = _batch(tr, idx, ctx)
            loss = F.binary_cross_entropy_with_logits(ddp_model(x), y)   # mean over my micro-batch
            opt.zero_grad()
            loss.backward()                                              # gradients averaged over ranks
            opt.step()
            sched.step()
            step += 1
            gloss = ctx.mean(loss.item())                                # equal micro-batches: mean of means
            history.append((step, gloss, t_train + ctx.now() - te))
            bar.update(loss=gloss)
        t_train += ctx.now() - te
        ckpt.save(epoch + 1, model, opt, history=history, step=step, seconds=t_train)
    bar.close()

    mean_design = tr["target"].mean(0)
    ev = evaluate(model, val, ctx, cfg, mean_design)
    hit = [h[0] for h in history if h[1] <= cfg.target_loss]
    res = dict(world_size=n, optimizer=cfg.optimizer, global_batch=G, lr=_lr(cfg), epochs=cfg.epochs,
               steps=step, samples=step * G, seconds=t_train, data_seconds=t_data,
               steps_to_target=hit[0] if hit else None,
               seconds_to_target=next((h[2] for h in history if h[1] <= cfg.target_loss), None),
               history=history, metrics=ev, n_params=n_parameters(model), shape=list(cfg.shape),
               run_name=cfg.run_name)
    ctx.write_result(CASE, summary(res))
    return res


def summary(res: dict) -> dict:
    """A result without its per-step history, plus the final loss: for printing and the result file."""
    out = training.summary(res)
    out["shape"] = res["shape"]
    out["final_loss"] = res["history"][-1][1] if res["history"] else None
    return out


def predict(cfg: Config, split: str = "val", n: int = 4) -> dict:
    """Serial helper for pictures: the first ``n`` designs of a split, SIMP's and the trained run's."""
    d = data.load(cfg.data_settings(split), use_cache=cfg.use_cache)
    model = UNet(in_ch=d["inputs"].shape[1], width=cfg.width, depth=cfg.depth, dim=len(cfg.shape))
    done, _ = training.Checkpointer(training.results_dir(CASE) / "ckpt" / cfg.run_name).load(model)
    if done == 0:
        raise ValueError(f"run {cfg.run_name!r} has no checkpoint; train it first")
    with torch.no_grad():
        pred = torch.sigmoid(model(torch.from_numpy(d["inputs"][:n])))[:, 0].numpy()
    return dict(inputs=d["inputs"][:n], target=d["target"][:n], pred=pred)


__all__ = ["Config", "train", "evaluate", "predict", "design_stats", "scores",
           "compliance_ratios", "summary"]


# --------------------------------------------------------------------------- pictures
def _problem_picture(inputs: np.ndarray) -> np.ndarray:
    """One image of a problem's channels: supports (+1), the loaded elements (-1)."""
    dim = (inputs.shape[0] - 1) // 2
    fixed = inputs[1 + dim:].max(0)
    load = np.abs(inputs[1:1 + dim]).sum(0) > 0
    return fixed - load.astype(float)


def plot_designs(inputs, target, pred=None, titles=("problem", "SIMP", "U-Net"), path=None):
    """Rows of samples: the problem (supports light, load dark), SIMP's design, and the prediction if given."""
    import matplotlib.pyplot as plt
    cols = 2 if pred is None else 3
    n = len(target)
    fig, axes = plt.subplots(n, cols, figsize=(2.6 * cols, 1.5 * n), squeeze=False)
    for i in range(n):
        imgs = [_problem_picture(inputs[i]), target[i]] + ([] if pred is None else [pred[i]])
        for j, img in enumerate(imgs):
            ax = axes[i, j]
            ax.imshow(img, cmap="coolwarm" if j == 0 else "gray_r", vmin=-1 if j == 0 else 0, vmax=1)
            ax.set_xticks([]), ax.set_yticks([])
            if i == 0:
                ax.set_title(titles[j], fontsize=9)
        axes[i, 0].set_ylabel(f"vf {inputs[i][0].flat[0]:.2f}", fontsize=8)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def plot_loss_curves(results: dict, target_loss: float | None = None, x: str = "step", ax=None):
    """Training loss against steps (``x='step'``) or seconds (``x='seconds'``) for several runs {label: result}."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.2))
    for label, r in results.items():
        h = np.asarray(r["history"])
        ax.plot(h[:, 0 if x == "step" else 2], h[:, 1], label=label, lw=1.2)
    if target_loss is not None:
        ax.axhline(target_loss, color="k", ls=":", lw=1)
    ax.set_xlabel("optimizer step" if x == "step" else "seconds")
    ax.set_ylabel("training loss (BCE)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return ax
