"""Lab 4: traffic-conflict classification from multi-camera driving clips.

    mpiexec -n 4 python -m ddlcourse run driving --scale laptop --backend ddp [--fresh] [mp=4 micro_batches=4]

``train(cfg)`` runs on every rank. The run's ranks form a ``dp x mp`` grid (``training.setup``): the ``mp``
ranks of a row hold one replica of the model (the view encoders and the fusion head spread over them,
:mod:`ddlcourse.parallel.branches`); the ``dp`` rows train data-parallel. ``mp = 1`` is plain data
parallelism through DDP or Horovod (``cfg.backend``).

Every replica sees its share of the same global batches as a serial run (see *who holds which clips* below),
so the loss trajectory does not depend on the number of ranks or on the grid; and each replica loads only
the clips it trains on, never the whole training set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from ddlcourse import metrics, plots_timeline, sharding, training
from ddlcourse.training import setting
from ddlcourse.data import driving as data
from ddlcourse.memory import SavedTensors
from ddlcourse.models.driving import MultiViewNet
from ddlcourse.parallel.branches import BranchParallel
from ddlcourse.parallel.data_parallel import unwrap

CASE = "driving"


@dataclass(kw_only=True)
class Config(training.CaseConfig):
    """The ``lab_driving`` sizes of a scale plus the run options of this case (``key=value`` on the CLI)."""

    CASE: ClassVar[str] = "driving"
    SECTION: ClassVar[str] = "lab_driving"
    n_clips: int = setting(min=1, help="training clips (chunks of 23, each with the class quotas 18 : 4 : 1)")
    n_val: int = setting(min=1, help="validation clips")
    frames: int = setting(min=2, help="frames per clip")
    size: int = setting(min=16, help="pixels on a side of a camera's frame")
    width: int = setting(min=1, help="channels of each view's encoder")
    feat: int = setting(min=1, help="features each view's encoder gives the head")
    hidden: int = setting(min=1, help="units of the head's hidden layer")
    epochs: int = setting(min=1, help="passes over the training clips")
    global_batch: int = setting(min=1, help="clips per step, over all replicas")
    lr: float = setting(above=0, help="AdamW's learning rate")
    weight_decay: float = setting(1e-4, min=0, help="AdamW's weight decay")
    weighted_loss: bool = setting(True, help="weigh the classes by their inverse frequency")
    mp: int = setting(1, min=1, help="model-parallel ranks per replica (views + head)")
    micro_batches: int = setting(1, min=1, help="micro-batches per step (the views and the head pipeline them)")
    use_cache: bool = setting(True, help="keep the generated clips on disk")
    measure_memory: bool = setting(False, help="measure the activation memory of each rank")

    def validate(self) -> None:
        super().validate()
        training.check_split_model(self.backend, self.mp)   # before any work: the views split the model
        if self.global_batch % self.micro_batches:
            raise training.ConfigError(f"global_batch={self.global_batch} does not split into "
                                       f"{self.micro_batches} micro-batches")
        if self.n_clips < self.global_batch:
            raise training.ConfigError(f"n_clips={self.n_clips} is less than one global batch ({self.global_batch})")


def check_mesh(cfg: Config, dp: int) -> None:
    """The checks that need the number of replicas."""
    if cfg.global_batch % (dp * cfg.micro_batches):
        raise training.ConfigError(f"global_batch={cfg.global_batch} must split into {dp} replicas x "
                                   f"{cfg.micro_batches} micro-batches")


# --------------------------------------------------------------------------- data: who holds which clips
# The training set is cut into ``global_batch`` contiguous *streams* of clips (sizes differ by at most one).
# Slot ``s`` of every global batch is drawn from stream ``s``, in an order drawn afresh each epoch, so the global
# batches depend on the seed and the epoch only, never on the number of ranks. A replica trains on the slots
# ``sharding.shard`` gives it, a contiguous run of streams, hence on one contiguous block of clips: it loads that
# block and nothing else (a quarter of the training set on 4 replicas).
def streams(n_clips: int, global_batch: int) -> list[tuple[int, int]]:
    """``(start, stop)`` clip ranges of the ``global_batch`` streams."""
    if n_clips < global_batch:
        raise ValueError(f"n_clips={n_clips} is less than one global batch ({global_batch} clips)")
    edges = np.concatenate([[0], np.cumsum(sharding.split_sizes(n_clips, global_batch))])
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def epoch_batches(n_clips: int, global_batch: int, epoch: int, seed: int = 0) -> np.ndarray:
    """The global batches of ``epoch`` as clip indices, ``(steps, global_batch)``: column ``s`` walks stream
    ``s`` in this epoch's order (the tail of a longer stream waits for a later epoch)."""
    bounds = streams(n_clips, global_batch)
    steps = n_clips // global_batch
    rng = np.random.default_rng([seed, epoch])
    return np.stack([lo + rng.permutation(hi - lo)[:steps] for lo, hi in bounds], 1)


def replica_slots(global_batch: int, dp: int, dp_index: int) -> np.ndarray:
    """The slots (columns of :func:`epoch_batches`) of replica ``dp_index`` of ``dp``: a contiguous run."""
    return sharding.shard(np.arange(global_batch), dp_index, dp)


def replica_clips(n_clips: int, global_batch: int, dp: int, dp_index: int) -> tuple[int, int]:
    """``(start, stop)``: the only clips replica ``dp_index`` of ``dp`` ever trains on (its streams)."""
    slots = replica_slots(global_batch, dp, dp_index)
    if len(slots) == 0:
        return 0, 0
    bounds = streams(n_clips, global_batch)
    return bounds[slots[0]][0], bounds[slots[-1]][1]


def block(n_items: int, dp: int, dp_index: int) -> tuple[int, int]:
    """``(start, stop)`` of replica ``dp_index``'s contiguous share of ``n_items`` (the validation clips)."""
    sizes = sharding.split_sizes(n_items, dp)
    start = sum(sizes[:dp_index])
    return start, start + sizes[dp_index]


def load_data(cfg: Config, ctx) -> tuple[dict, dict]:
    """This replica's training clips (its streams) and its share of the validation clips, nothing more.

    The ``mp`` ranks of one replica need the same clips. With the cache on, each chunk (23 clips) is made once:
    by the first rank of the replica whose block holds the chunk's first clip; after a barrier the others read it.
    """
    g = ctx.grid
    kw = dict(frames=cfg.frames, size=cfg.size)
    tr_lo, tr_hi = replica_clips(cfg.n_clips, cfg.global_batch, ctx.dp, g.coord("dp"))
    va_lo, va_hi = block(cfg.n_val, ctx.dp, g.coord("dp"))
    if cfg.use_cache and ctx.world_size > 1:
        if g.coord("mp") == 0:
            for n, seed, lo, hi in ((cfg.n_clips, cfg.seed, tr_lo, tr_hi), (cfg.n_val, cfg.seed + 10_000, va_lo, va_hi)):
                data.make_chunks(n, [c for c in data.chunks_of(lo, hi) if lo <= c * data.CHUNK < hi], seed=seed, **kw)
        ctx.barrier()                       # the run's ranks only: others may have left (ranks < world)
    train = data.load_clips(cfg.n_clips, tr_lo, tr_hi, seed=cfg.seed, use_cache=cfg.use_cache, **kw)
    val = data.load_clips(cfg.n_val, va_lo, va_hi, seed=cfg.seed + 10_000, use_cache=cfg.use_cache, **kw)
    return train, val


def class_weights(counts) -> torch.Tensor:
    """Inverse class frequency (from the class ``counts`` of the training set), normalised to mean 1 over the
    samples, so the loss scale stays comparable."""
    counts = np.asarray(counts, float)
    w = np.where(counts > 0, counts.sum() / (3 * np.maximum(counts, 1)), 0.0)
    return torch.tensor(w, dtype=torch.float32)


def summed_loss(weights: torch.Tensor | None):
    """The (class-weighted) cross-entropy summed over a batch; ``weights`` on the logits' device."""
    def fn(logits, target):
        loss = F.cross_entropy(logits, target, reduction="none")
        return (loss if weights is None else loss * weights[target]).sum()
    return fn


# --------------------------------------------------------------------------- training
def _checkpointer(cfg: Config, ctx):
    """Checkpoints per layout: with mp > 1 each model part has its own folder (the context's rule)."""
    run = cfg.run_name if cfg.mp == 1 else f"{cfg.run_name}-mp{cfg.mp}"
    return ctx.checkpointer(CASE, epochs=cfg.epochs, run_name=run)


def train(cfg: Config, progress_file: str | None = None, head_step=None) -> dict | None:
    """Train on this rank's share; every rank of the run returns the result (rank 0 also writes it).

    ``head_step``: with ``cfg.mp > 1``, the head rank's messages of one micro-batch (the lab's coding exercise,
    ``exercises.solutions.driving.head_step_solution`` is the reference); None: the package's own code."""
    ctx = training.setup(cfg, mesh=(None, cfg.mp), progress_file=progress_file)   # every rank of the world
    if ctx is None:
        return None
    g = ctx.grid
    dp, B = ctx.dp, cfg.global_batch
    check_mesh(cfg, dp)
    with ctx.timer() as t_data:
        tr, va = load_data(cfg, ctx)
    tr_lo, tr_hi = replica_clips(cfg.n_clips, B, dp, g.coord("dp"))
    X, y = torch.from_numpy(tr["video"]), torch.from_numpy(tr["label"])   # stay on the host; batches move
    first = g.coord("mp") == 0                                          # counts each replica's clips once
    counts = ctx.sum(np.bincount(tr["label"], minlength=3) * first).astype(np.int64)
    val_labels = np.concatenate(ctx.comm.allgather(va["label"] if first else va["label"][:0]))
    loss_fn = summed_loss(ctx.to(class_weights(counts)) if cfg.weighted_loss else None)

    torch.manual_seed(cfg.seed)                    # the same initial model on every rank
    model = ctx.to(MultiViewNet(3, cfg.width, cfg.feat, cfg.hidden))
    if cfg.mp > 1:
        net = BranchParallel(model, cfg.mp, g.coord("mp"), g.ranks("mp"), g.group("dp"), mp_group=g.group("mp"),
                             head_step=head_step)
        opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ckpt = _checkpointer(cfg, ctx)
    start, extra = ckpt.load(model, opt)
    history = list(extra.get("history", []))
    if cfg.mp == 1:
        net, opt = ctx.wrap(model, opt)

    local = B // dp
    slots = replica_slots(B, dp, g.coord("dp"))
    steps_per_epoch = cfg.n_clips // B
    bar = ctx.progress((cfg.epochs - start) * steps_per_epoch, desc=f"driving dp={dp} mp={cfg.mp}")
    t_train, samples, timed_steps, t_step = 0.0, 0, 0, 0.0
    for epoch in range(start, cfg.epochs):
        for k, batch in enumerate(epoch_batches(cfg.n_clips, B, epoch, cfg.seed)):
            idx = torch.from_numpy(batch[slots] - tr_lo)                 # this replica's share, in its own block
            xb, yb = ctx.to((X[idx].float(), y[idx]))
            with ctx.timer() as t:
                opt.zero_grad()            # (Horovod's optimizer takes no set_to_none)
                if cfg.mp > 1:
                    net.events.clear()                      # keep the timeline of the last step only
                    t_step = ctx.now()
                    loss = net.step(xb, yb, loss_fn, cfg.micro_batches)
                else:
                    loss_t = torch.zeros((), device=ctx.device)
                    for xm, ym in zip(xb.chunk(cfg.micro_batches), yb.chunk(cfg.micro_batches)):
                        l_m = loss_fn(net(xm), ym) / local
                        l_m.backward()
                        loss_t += l_m.detach()
                    loss = loss_t.item()
                opt.step()
            if epoch > start or k > 0:          # the first step warms up (allocations, first messages)
                t_train += t.seconds
                samples += B
                timed_steps += 1
            gl = ctx.mean(loss)                 # the global mean loss (a replica's ranks share its loss)
            history.append(gl)
            bar.update(1, epoch=epoch + 1, loss=gl)
        ckpt.save(epoch + 1, model, opt, history=history)
    bar.close()
    timeline = None
    if cfg.mp > 1:   # the last training step's events, relative to its start, from every rank
        mine = [(e.rank, e.kind, e.micro, e.start, e.end) for e in net.events]
        timeline = plots_timeline.gather_events(plots_timeline.relative_events(mine, t_step), ctx.comm)
    memory = _memory_per_rank(cfg, net, *ctx.to((X[:local].float(), y[:local])), loss_fn, ctx) \
        if cfg.measure_memory else None
    scores = evaluate(cfg, net, va, ctx)
    n_params = sum(p.numel() for p in net.parameters())
    seconds = ctx.max(t_train)
    result = dict(case=CASE, scale=cfg.scale, ranks=ctx.world_size, dp=dp, mp=cfg.mp,
                  micro_batches=cfg.micro_batches, backend=cfg.backend, device=str(ctx.device), epochs=cfg.epochs,
                  global_batch=B, history=history, seconds=seconds, samples=samples, timed_steps=timed_steps,
                  step_seconds=seconds / max(1, timed_steps), data_seconds=ctx.max(t_data.seconds),
                  params_per_rank=ctx.comm.allgather(n_params), memory=memory, timeline=timeline, **scores,
                  baseline=majority_baseline(val_labels), class_counts=counts.tolist(),
                  train_clips=ctx.comm.allgather([tr_lo, tr_hi]))     # the clips each rank holds
    ctx.write_result(CASE, result)
    return result


def _memory_per_rank(cfg, model, xb, yb, loss_fn, ctx) -> list[dict]:
    """Parameter bytes and bytes saved for backward on each rank, for one local batch."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    meter = SavedTensors(skip=model.parameters())
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
            buf = torch.empty(video.shape[0], _feat(bp), device=video.device)
            tdist.recv(buf, bp.mp_ranks[owner])
            parts.append(buf)
    return bp.model.head(torch.cat(parts, 1))


def _feat(bp) -> int:
    """Features per view that the head of a branch-parallel model takes."""
    return bp.model.head.mlp[0].in_features // len(bp.owners)


@torch.no_grad()
def evaluate(cfg: Config, model, va: dict, ctx, batch: int = 32) -> dict:
    """Macro-F1, balanced accuracy, per-class recall and the confusion matrix over the whole validation set
    (each replica scores its own share ``va``; the confusion matrices are summed over the ranks)."""
    preds = []
    for s in range(0, len(va["label"]), batch):
        xb = ctx.to(torch.from_numpy(va["video"][s:s + batch]).float())
        lg = _logits_mp(model, xb) if cfg.mp > 1 else unwrap(model)(xb)
        if lg is not None:
            preds.append(ctx.numpy(lg.argmax(1)))
    counts = cfg.mp == 1 or model.has_head                            # one rank per replica contributes
    p = np.concatenate(preds) if counts and preds else np.zeros(0, np.int64)
    t = va["label"] if counts else np.zeros(0, np.int64)
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
def summary(res: dict) -> dict:
    """What the command line prints (rank 0)."""
    return {k: res[k] for k in ("ranks", "dp", "mp", "device", "macro_f1", "balanced_acc", "baseline", "seconds",
                                "samples")}


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


def predict_local(cfg: Config, video: np.ndarray, run_name: str | None = None) -> np.ndarray:
    """Predicted classes of clips, with the data-parallel model of run ``run_name`` loaded from its checkpoint."""
    model = MultiViewNet(3, cfg.width, cfg.feat, cfg.hidden)
    ck = training.Checkpointer(training.results_dir(CASE) / "ckpt" / (run_name or cfg.run_name))
    epochs, _ = ck.load(model)
    if epochs == 0:
        raise FileNotFoundError(f"no checkpoint for run {run_name or cfg.run_name!r}: train it first")
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(video, np.float32))).argmax(1).numpy()
