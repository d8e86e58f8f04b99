"""Lab 4: traffic-conflict classification from multi-camera driving clips.

    mpiexec -n 4 python -m ddlcourse run driving --scale laptop --backend ddp [--mp 4 --micro-batches 4]

``train(cfg)`` runs on every rank. ``cfg.mp`` ranks hold one replica of the model (the view encoders and the
fusion head spread over them, :mod:`ddlcourse.parallel.branches`); ``ranks / mp`` replicas train
data-parallel. ``mp = 1`` is plain data parallelism through DDP or Horovod (``cfg.backend``).

Every replica sees the same global batches as a serial run (a global permutation per epoch, sliced per
replica), so the loss trajectory does not depend on the number of ranks or on the mesh.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch
import torch.nn.functional as F

from ddlcourse import config, metrics, training
from ddlcourse.data import driving as data
from ddlcourse.models.driving import MultiViewNet

CASE = "driving"


@dataclass
class Config:
    n_clips: int = 460
    n_val: int = 184
    frames: int = 12
    size: int = 48
    width: int = 8
    feat: int = 32
    hidden: int = 64
    epochs: int = 6
    global_batch: int = 16
    lr: float = 3e-3
    weight_decay: float = 1e-4
    weighted_loss: bool = True
    seed: int = 0
    backend: str = "ddp"
    ranks: int | None = None           # use the first `ranks` MPI ranks (None: all)
    mp: int = 1                        # model-parallel ranks per replica (views + head)
    micro_batches: int = 1
    run_name: str = "default"
    resume: bool = True
    use_cache: bool = True
    measure_memory: bool = False
    scale: str = "laptop"

    def validate(self, world: int) -> None:
        n = self.ranks or world
        if n > world:
            raise ValueError(f"ranks={n} but only {world} MPI ranks are running")
        if self.mp < 1 or n % self.mp:
            raise ValueError(f"mp={self.mp} must divide the number of ranks {n}")
        if self.mp > 1 and self.backend == "horovod":
            raise ValueError("model parallelism (mp > 1) uses torch.distributed point-to-point; use backend='ddp'")
        dp = n // self.mp
        if self.global_batch % (dp * self.micro_batches):
            raise ValueError(f"global_batch={self.global_batch} must split into {dp} replicas x "
                             f"{self.micro_batches} micro-batches")


def from_scale(scale: str | None = None, **overrides) -> Config:
    s = config.sizes("lab_driving", scale)
    known = {f.name for f in fields(Config)}
    base = {k: v for k, v in vars(s).items() if k in known}
    return Config(**{**base, "scale": s.scale, **overrides})


# --------------------------------------------------------------------------- data
def load_data(cfg: Config, ctx) -> tuple[dict, dict]:
    """The ranks of the run make their own chunks (in parallel), then read the whole train and validation sets."""
    kw = dict(frames=cfg.frames, size=cfg.size, use_cache=cfg.use_cache)
    if cfg.use_cache and ctx.world_size > 1:
        n_train_chunks = -(-cfg.n_clips // 23)
        if ctx.world_size <= n_train_chunks:
            data.generate(cfg.n_clips, seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size, **kw)
        ctx.barrier()                       # the run's ranks only: others may have left (ranks < world)
    train = data.generate(cfg.n_clips, seed=cfg.seed, **kw)
    val = data.generate(cfg.n_val, seed=cfg.seed + 10_000, **kw)
    return train, val


def class_weights(labels: np.ndarray) -> torch.Tensor:
    """Inverse class frequency, normalised to mean 1 over the samples (so the loss scale stays comparable)."""
    counts = np.bincount(labels, minlength=3).astype(float)
    w = np.where(counts > 0, len(labels) / (3 * np.maximum(counts, 1)), 0.0)
    return torch.tensor(w, dtype=torch.float32)


def summed_loss(weights: torch.Tensor | None):
    def fn(logits, target):
        return F.cross_entropy(logits, target, weight=weights, reduction="none").sum() if weights is None else \
            (F.cross_entropy(logits, target, reduction="none") * weights[target]).sum()
    return fn


# --------------------------------------------------------------------------- mesh
_GROUPS: dict = {}


def _mesh(n: int, mp: int):
    """Groups for the first ``n`` ranks as ``dp x mp`` (collective over the whole world; cached)."""
    import torch.distributed as tdist
    key = (n, mp)
    if key not in _GROUPS:
        r = tdist.get_rank()
        mine = {"mp_group": None, "dp_group": None, "mp_ranks": None, "mp_index": None, "dp_index": None}
        dp = n // mp
        for d in range(dp):                       # replicas: neighbouring ranks
            ranks = [d * mp + m for m in range(mp)]
            g = tdist.new_group(ranks)
            if r in ranks:
                mine.update(mp_group=g, mp_ranks=ranks, mp_index=ranks.index(r), dp_index=d)
        for m in range(mp):                       # same part of the model, different data
            ranks = [d * mp + m for d in range(dp)]
            g = tdist.new_group(ranks)
            if r in ranks:
                mine["dp_group"] = g
        _GROUPS[key] = mine
    return _GROUPS[key]


class _WriterCtx:
    """Checkpoint writer per model part: the first replica writes, everyone waits."""

    def __init__(self, ctx, is_root):
        self.is_root, self._ctx = is_root, ctx

    def barrier(self):
        self._ctx.barrier()


# --------------------------------------------------------------------------- training
def train(cfg: Config, progress_file: str | None = None) -> dict | None:
    from ddlcourse import dist
    from ddlcourse.parallel.branches import BranchParallel

    info = dist.init(horovod=cfg.backend == "horovod")
    cfg.validate(info.world_size)
    n = cfg.ranks or info.world_size
    mesh = _mesh(n, cfg.mp) if cfg.mp > 1 else None
    ctx = training.setup(cfg.backend, ranks=cfg.ranks, seed=cfg.seed, progress_file=progress_file)
    if ctx is None:
        return None
    dp = n // cfg.mp
    dp_index = mesh["dp_index"] if mesh else ctx.rank
    t_data = time.perf_counter()
    tr, va = load_data(cfg, ctx)
    t_data = time.perf_counter() - t_data
    X, y = torch.from_numpy(tr["video"]), torch.from_numpy(tr["label"])
    weights = class_weights(tr["label"]) if cfg.weighted_loss else None
    loss_fn = summed_loss(weights)

    torch.manual_seed(cfg.seed)                    # the same initial model on every rank
    model = MultiViewNet(3, cfg.width, cfg.feat, cfg.hidden)
    if cfg.mp > 1:
        bp = BranchParallel(model, cfg.mp, mesh["mp_index"], mesh["mp_ranks"], mesh["dp_group"], mp_group=mesh["mp_group"])
        opt = torch.optim.AdamW(bp.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        writer = _WriterCtx(ctx, is_root=dp_index == 0)
        ck_dir = training.results_dir(CASE) / "ckpt" / f"{cfg.run_name}-mp{cfg.mp}" / f"part{mesh['mp_index']}"
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        model, opt = ctx.wrap(model, opt)
        writer = ctx
        ck_dir = training.results_dir(CASE) / "ckpt" / cfg.run_name
    ckpt = training.Checkpointer(ck_dir, writer)
    if not cfg.resume:
        ckpt.clear()
    start, extra = ckpt.load(model, opt)
    history = extra.get("history", [])

    B = cfg.global_batch
    local = B // dp
    steps_per_epoch = len(y) // B
    bar = ctx.progress((cfg.epochs - start) * steps_per_epoch, desc=f"driving dp={dp} mp={cfg.mp}")
    memory = None
    t_train, samples, timed_steps = 0.0, 0, 0
    for epoch in range(start, cfg.epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg.seed * 7919 + epoch))
        for k in range(steps_per_epoch):
            idx = order[k * B:(k + 1) * B][dp_index * local:(dp_index + 1) * local]   # this replica's share
            xb, yb = X[idx].float(), y[idx]
            t0 = time.perf_counter()
            opt.zero_grad()            # (Horovod's optimizer takes no set_to_none)
            if cfg.mp > 1:
                bp.events.clear()                       # keep the timeline of the last step only
                t_step = time.perf_counter()
                loss = bp.step(xb, yb, loss_fn, cfg.micro_batches)
            else:
                loss_t = 0.0
                for xm, ym in zip(xb.chunk(cfg.micro_batches), yb.chunk(cfg.micro_batches)):
                    l_m = loss_fn(model(xm), ym) / local
                    l_m.backward()
                    loss_t += l_m.item()
                loss = loss_t
            opt.step()
            if epoch > start or k > 0:          # the first step warms up (allocations, first messages)
                t_train += time.perf_counter() - t0
                samples += B
                timed_steps += 1
            # the global mean loss: replicas' means averaged (equal replica batches)
            gl = ctx.comm.allreduce(loss) / ctx.world_size if cfg.mp == 1 else \
                ctx.comm.allreduce(loss if mesh["mp_index"] == 0 else 0.0) / dp
            history.append(gl)
            bar.update(1, epoch=epoch + 1, loss=gl)
        ckpt.save(epoch + 1, model, opt, history=history)
    bar.close()
    timeline = None
    if cfg.mp > 1:   # the last training step's events, relative to its start, from every rank
        mine = [(e.rank, e.kind, e.micro, e.start - t_step, e.end - t_step) for e in bp.events]
        timeline = [ev for part in ctx.comm.allgather(mine) for ev in part]
    if cfg.measure_memory:
        memory = _memory_per_rank(cfg, model if cfg.mp == 1 else bp, X[:local].float(), y[:local], loss_fn, ctx)
    scores = evaluate(cfg, model if cfg.mp == 1 else bp, va, ctx, mesh)
    n_params = sum(p.numel() for p in (model.parameters() if cfg.mp == 1 else bp.parameters()))
    result = dict(case=CASE, scale=cfg.scale, ranks=n, dp=dp, mp=cfg.mp, micro_batches=cfg.micro_batches,
                  backend=cfg.backend, epochs=cfg.epochs, global_batch=B, history=history,
                  seconds=ctx.comm.allreduce(t_train, op=_max()), samples=samples, timed_steps=timed_steps,
                  step_seconds=ctx.comm.allreduce(t_train, op=_max()) / max(1, timed_steps), data_seconds=t_data,
                  params_per_rank=ctx.comm.allgather(n_params), memory=memory, timeline=timeline, **scores,
                  baseline=majority_baseline(va["label"]), class_counts=np.bincount(tr["label"], minlength=3).tolist())
    if ctx.is_root:
        (training.results_dir(CASE) / f"result-{cfg.run_name}.json").write_text(json.dumps(result, indent=1, default=float))
    return result


def _max():
    from mpi4py import MPI
    return MPI.MAX


def _memory_per_rank(cfg, model, xb, yb, loss_fn, ctx) -> list[dict]:
    """Parameter bytes and bytes saved for backward on each rank, for one local batch."""
    from ddlcourse.memory import SavedTensorMeter
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    meter = SavedTensorMeter()
    with meter:
        if cfg.mp > 1:
            model.step(xb, yb, loss_fn, cfg.micro_batches)
        else:
            (loss_fn(model(xb), yb) / len(yb)).backward()
    for p in model.parameters():
        p.grad = None
    return ctx.comm.allgather({"params": params, "activations": meter.bytes})


@torch.no_grad()
def _logits_mp(bp, video):
    """Forward only, model-parallel: features to the head; logits on the head rank, None elsewhere."""
    import torch.distributed as tdist
    feats = {br: bp.model.encoders[br](video[:, br:br + 1]) for br in bp.my_branches}
    if not bp.has_head:
        for br, f in feats.items():
            tdist.send(f.contiguous(), bp.head_rank)
        return None
    parts = []
    for br, owner in enumerate(bp.owners):
        if owner == bp.mp_index:
            parts.append(feats[br])
        else:
            buf = torch.empty(video.shape[0], cfg_feat(bp))
            tdist.recv(buf, bp.mp_ranks[owner])
            parts.append(buf)
    return bp.model.head(torch.cat(parts, 1))


def cfg_feat(bp) -> int:
    return bp.model.head.mlp[0].in_features // len(bp.owners)


@torch.no_grad()
def evaluate(cfg: Config, model, va: dict, ctx, mesh) -> dict:
    """Macro-F1, balanced accuracy, per-class recall and the confusion matrix, over the whole validation set."""
    dp = (cfg.ranks or ctx.world_size) // cfg.mp
    dp_index = mesh["dp_index"] if mesh else ctx.rank
    idx = np.arange(dp_index, len(va["label"]), dp)                   # this replica's share
    Xv, yv = torch.from_numpy(va["video"][idx]).float(), va["label"][idx]
    preds = []
    for s in range(0, len(idx), 32):
        if cfg.mp > 1:
            lg = _logits_mp(model, Xv[s:s + 32])
        else:
            m = model.module if hasattr(model, "module") else model
            lg = m(Xv[s:s + 32])
        if lg is not None:
            preds.append(lg.argmax(1).numpy())
    counts = cfg.mp == 1 or model.has_head                            # one rank per replica contributes
    p = np.concatenate(preds) if counts and preds else np.zeros(0, np.int64)
    t = yv if counts else np.zeros(0, np.int64)
    cm = metrics.confusion_matrix(p, t, 3, comm=ctx.comm)
    s = metrics.classification_scores(cm)
    return {"macro_f1": s["macro_f1"], "balanced_acc": s["balanced_acc"], "recall": s["recall"],
            "confusion": cm.tolist()}


def majority_baseline(labels: np.ndarray) -> dict:
    """Always predict the most frequent class (baseline): its macro-F1 and balanced accuracy."""
    maj = np.bincount(labels, minlength=3).argmax()
    s = metrics.classification_scores(metrics.confusion_matrix(np.full_like(labels, maj), labels, 3))
    return {"macro_f1": s["macro_f1"], "balanced_acc": s["balanced_acc"]}


# --------------------------------------------------------------------------- command line
def cli(argv: list[str], scale: str | None = None, backend: str = "ddp") -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse run driving")
    p.add_argument("--epochs", type=int)
    p.add_argument("--global-batch", type=int)
    p.add_argument("--mp", type=int, default=1, help="model-parallel ranks per replica (views + head)")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--run-name", default="cli")
    p.add_argument("--no-resume", action="store_true")
    a = p.parse_args(argv)
    over = {k: v for k, v in dict(epochs=a.epochs, global_batch=a.global_batch).items() if v is not None}
    cfg = from_scale(scale, backend=backend, mp=a.mp, micro_batches=a.micro_batches, run_name=a.run_name,
                     resume=not a.no_resume, **over)
    res = train(cfg)
    from ddlcourse import dist
    if dist.rank() == 0:
        print(json.dumps({k: res[k] for k in ("ranks", "dp", "mp", "macro_f1", "balanced_acc", "baseline",
                                              "seconds", "samples")}, default=float))
    return 0


# --------------------------------------------------------------------------- pictures
def plot_clip(video: np.ndarray, label: int | None = None, frames: int = 4, title: str = ""):
    """The three synchronized views of one clip (views, T, H, W), a few frames each."""
    import matplotlib.pyplot as plt
    T = video.shape[1]
    ts = np.linspace(0, T - 1, frames).round().astype(int)
    fig, axes = plt.subplots(3, frames, figsize=(1.6 * frames, 5.0))
    for v in range(3):
        for j, t in enumerate(ts):
            ax = axes[v, j]
            ax.imshow(np.asarray(video[v, t], np.float32), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([]), ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(data.VIEWS[v], fontsize=8)
            if v == 0:
                ax.set_title(f"t = {t * (40 / T) * data.DT:.1f} s", fontsize=8)
    head = title or (f"label: {data.CLASSES[label]}" if label is not None else "")
    fig.suptitle(head, fontsize=9)
    fig.tight_layout()
    return fig


def plot_scenarios(seed: int = 0):
    """One simulated clip per scenario: ego and other trajectories (top) and the TTC over time (bottom)."""
    import matplotlib.pyplot as plt
    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(2, 3, figsize=(10, 4.4), gridspec_kw={"height_ratios": [1.3, 1]})
    for j, sc in enumerate(data.SCENARIOS):
        st = data.simulate(rng, sc)["states"]
        cls, t_min, dec = data.label(st)
        ax = axes[0, j]
        for i, o in enumerate(st):
            ax.plot(o[:, 0], o[:, 1], "-", color="C0" if i == 0 else f"C{i}", lw=2 if i < 2 else 1)
            ax.plot(o[-1, 0], o[-1, 1], "s", color="C0" if i == 0 else f"C{i}", ms=4)
        ax.set_title(f"{sc}: {data.CLASSES[cls]}", fontsize=9)
        ax.set_xlabel("x (m)", fontsize=8), ax.set_ylabel("y (m)", fontsize=8)
        ttc = data.time_to_collision(st[0], st[1])
        t = np.arange(st.shape[1]) * data.DT
        axes[1, j].plot(t, np.minimum(ttc, 3.0), label="TTC (capped at 3 s)")
        axes[1, j].plot(t, -st[0, :, 4], label="ego deceleration (m/s²)")
        axes[1, j].axhline(data.TTC_NEAR, color="r", ls="--", lw=1, label="1.5 s")
        axes[1, j].set_xlabel("time (s)", fontsize=8)
        if j == 0:
            axes[1, j].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_confusion(cm, ax=None, title: str = ""):
    import matplotlib.pyplot as plt
    cm = np.asarray(cm)
    if ax is None:
        _, ax = plt.subplots(figsize=(3.4, 3.0))
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    for i in range(3):
        for j in range(3):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=9,
                    color="white" if norm[i, j] > 0.5 else "black")
    ax.set_xticks(range(3), data.CLASSES, fontsize=7), ax.set_yticks(range(3), data.CLASSES, fontsize=7)
    ax.set_xlabel("predicted"), ax.set_ylabel("true"), ax.set_title(title, fontsize=9)
    return ax


def plot_timeline(events, ax=None, title: str = ""):
    """Which rank computes what during one step: F = view encoder forward, H = head, B = encoder backward."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.2))
    colors = {"F": "#4C72B0", "H": "#C44E52", "B": "#55A868"}
    for rank, kind, micro, t0, t1 in events:
        ax.barh(rank, t1 - t0, left=t0, color=colors[kind], edgecolor="white")
        ax.text((t0 + t1) / 2, rank, f"{kind}{micro}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(sorted({e[0] for e in events}))
    ax.set_ylabel("rank"), ax.set_xlabel("seconds into the step"), ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    return ax


def predict_local(cfg: Config, video: np.ndarray, run_name: str | None = None) -> np.ndarray:
    """Predicted classes of clips, with the data-parallel model of run ``run_name`` loaded from its checkpoint."""
    model = MultiViewNet(3, cfg.width, cfg.feat, cfg.hidden)
    ck = training.Checkpointer(training.results_dir(CASE) / "ckpt" / (run_name or cfg.run_name))
    epochs, _ = ck.load(model)
    if epochs == 0:
        raise FileNotFoundError(f"no checkpoint for run {run_name or cfg.run_name!r}: train it first")
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(video, np.float32))).argmax(1).numpy()
