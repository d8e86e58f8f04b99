"""Hyper-parameter search on a cluster: independent trials farmed out through ipyparallel's load-balanced view.

Search space: learning rate ``lr`` (log-uniform), ``momentum``, ``batch_size`` and ``warmup`` steps.

* :func:`train_trial` trains one configuration for a *budget* of training samples and returns its validation
  loss. It is importable, so engines run it from the package; it is deterministic, so a trial gives the same
  result on any engine (or in this process).
* :func:`run_trials` submits trials to a view (``client.load_balanced_view()``) or runs them here when
  ``view=None``; results are collected *as they arrive* (``concurrent.futures.as_completed``) with a tqdm bar.
* :func:`random_search` (Bergstra & Bengio 2012), :func:`successive_halving` (Jamieson & Talwalkar 2016)
  and :func:`hyperband` (Li et al. 2018), which runs successive halving in brackets that trade the number of
  configurations against the budget each one starts with.

Budgets count training *samples* (``steps = budget // batch_size``), so large and small batches see the same
data: a budget in steps would favour large batches.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import as_completed
from functools import lru_cache

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from ddlcourse.data import toy
from ddlcourse.device import now, rank_device
from ddlcourse.models.small import MLP
from ddlcourse.optim import with_warmup

# name -> (kind, args). kinds: "log" (log-uniform low..high), "uniform" (low..high), "choice" (values)
SPACE = {
    "lr": ("log", 1e-3, 1.0),
    "momentum": ("choice", (0.0, 0.5, 0.9, 0.95)),
    "batch_size": ("choice", (16, 32, 64, 128)),
    "warmup": ("choice", (0, 10, 50)),
}

# The training task of every trial: teacher-labelled points and a small MLP (ddlcourse.data.toy / models.small).
TASK = dict(n_train=4096, n_val=1024, dim=16, n_classes=4, hidden=64, depth=2, data_seed=0, init_seed=0)


# --------------------------------------------------------------------------- configurations
def sample_configs(n: int, seed: int = 0, space: dict | None = None) -> list[dict]:
    """``n`` random configurations, each with a ``trial`` id 0..n-1 (same seed, same list)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    space = space or SPACE
    g = np.random.default_rng(seed)
    out = []
    for t in range(n):
        cfg = {"trial": t}
        for name, spec in space.items():
            kind = spec[0]
            if kind == "log":
                cfg[name] = float(np.exp(g.uniform(np.log(spec[1]), np.log(spec[2]))))
            elif kind == "uniform":
                cfg[name] = float(g.uniform(spec[1], spec[2]))
            elif kind == "choice":
                v = spec[1][g.integers(len(spec[1]))]
                cfg[name] = v.item() if hasattr(v, "item") else v
            else:
                raise ValueError(f"unknown kind {kind!r} for {name!r}; use 'log', 'uniform' or 'choice'")
        out.append(cfg)
    return out


def grid_configs(lrs, batch_sizes, momentum: float = 0.0, warmup: int = 0) -> list[dict]:
    """Every (lr, batch_size) pair with the other settings fixed (the learning-rate scaling exercise)."""
    return [{"trial": i, "lr": float(lr), "momentum": momentum, "batch_size": int(b), "warmup": warmup}
            for i, (b, lr) in enumerate((b, lr) for b in batch_sizes for lr in lrs)]


# --------------------------------------------------------------------------- one trial
@lru_cache(maxsize=4)
def _data(n_train: int, n_val: int, dim: int, n_classes: int, data_seed: int):
    X, y = toy.teacher_classification(n_train + n_val, dim=dim, n_classes=n_classes, seed=data_seed)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]   # (n, dim), (n,)


def train_trial(config: dict, budget: int, task: dict | None = None, device=None) -> dict:
    """Train ``config`` on ``budget`` training samples; return the config with ``val_loss``, ``val_acc``, timings.

    The model's initial weights (``init_seed``) and the data are the same in every trial; the batch order is
    seeded by the trial id, so a trial's result does not depend on which engine runs it. The trial runs on
    ``device`` (default: the rank's, :func:`ddlcourse.device.rank_device`).
    """
    device = rank_device(device)
    t0 = now(device)
    task = {**TASK, **(task or {})}
    for k in ("lr", "momentum", "batch_size", "warmup"):
        if k not in config:
            raise ValueError(f"config lacks {k!r}; it needs lr, momentum, batch_size and warmup")
    b = int(config["batch_size"])
    steps = max(1, int(budget) // b)
    Xtr, ytr, Xva, yva = (t.to(device) for t in
                          _data(task["n_train"], task["n_val"], task["dim"], task["n_classes"], task["data_seed"]))

    torch.manual_seed(task["init_seed"])
    model = MLP(task["dim"], task["n_classes"], hidden=task["hidden"], depth=task["depth"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    sched = with_warmup(opt, int(config["warmup"]), total_steps=steps)
    g = torch.Generator().manual_seed(1000 + int(config.get("trial", 0)))
    loss_fn = nn.CrossEntropyLoss()
    diverged = False
    for _ in range(steps):
        idx = torch.randint(0, len(Xtr), (b,), generator=g).to(device)   # drawn on the host: the same everywhere
        loss = loss_fn(model(Xtr[idx]), ytr[idx])            # Xtr[idx]: (batch, dim)
        if not torch.isfinite(loss):
            diverged = True
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        logits = model(Xva)
        val_loss = float(loss_fn(logits, yva))
        val_acc = float((logits.argmax(1) == yva).float().mean())
    if diverged or not math.isfinite(val_loss):
        val_loss, val_acc, diverged = float("inf"), 0.0, True
    return {**config, "budget": int(budget), "steps": steps, "val_loss": val_loss, "val_acc": val_acc,
            "diverged": diverged, "seconds": now(device) - t0}


def warm_up(task: dict | None = None) -> bool:
    """Import torch and build the data on an engine, so the first timed trial does not pay for it."""
    train_trial({"lr": 0.01, "momentum": 0.0, "batch_size": 16, "warmup": 0}, 16, task)
    return True


# --------------------------------------------------------------------------- farming trials out
def _progress(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, disable=not enabled, leave=True, mininterval=0.5)


def run_trials(configs: list[dict], budget: int, view=None, task: dict | None = None,
               progress: bool = True, desc: str = "trials") -> list[dict]:
    """Run ``train_trial(cfg, budget)`` for every config; results in the order they finished.

    ``view`` is an ipyparallel view (``client.load_balanced_view()``: each trial goes to whichever engine is
    free) or ``None`` to run here, one after another. Each result gets ``engine``, ``start`` and ``end``
    (seconds since submission) for the timeline plot.
    """
    if not configs:
        raise ValueError("no configurations to run")
    results = []
    bar = _progress(len(configs), desc, progress)
    t0 = time.perf_counter()
    try:
        if view is None:
            for cfg in configs:
                s = time.perf_counter() - t0
                r = train_trial(cfg, budget, task)
                results.append({**r, "engine": 0, "start": s, "end": time.perf_counter() - t0})
                _tick(bar, results)
        else:
            futures = [view.apply_async(train_trial, cfg, budget, task) for cfg in configs]
            wall0 = time.time()
            for fut in as_completed(futures):       # NEW: collect each result the moment it arrives
                r = fut.get()
                md = fut.metadata
                start = (md["started"].timestamp() - wall0) if md.get("started") else float("nan")
                end = (md["completed"].timestamp() - wall0) if md.get("completed") else time.perf_counter() - t0
                results.append({**r, "engine": md.get("engine_id", -1), "start": start, "end": end})
                _tick(bar, results)
    finally:
        bar.close()
    return results


def _tick(bar, results: list[dict]) -> None:
    best = min(r["val_loss"] for r in results)
    bar.set_postfix(best_val_loss=f"{best:.3f}", refresh=False)
    bar.update(1)


def timed_run(configs: list[dict], budget: int, view=None, **kwargs) -> tuple[float, list[dict]]:
    """``run_trials`` and its wall-clock seconds."""
    t0 = time.perf_counter()
    res = run_trials(configs, budget, view, **kwargs)
    return time.perf_counter() - t0, res


def best(results: list[dict]) -> dict:
    return min(results, key=lambda r: (r["val_loss"], r["trial"]))


# --------------------------------------------------------------------------- search strategies
def random_search(n_trials: int, budget: int, view=None, seed: int = 0, **kwargs) -> list[dict]:
    """``n_trials`` random configurations, each trained on the full ``budget``."""
    return run_trials(sample_configs(n_trials, seed), budget, view, **kwargs)


def top_k(results: list[dict], k: int) -> list[dict]:
    """The ``k`` lowest validation losses (ties broken by trial id, so the choice is deterministic)."""
    return sorted(results, key=lambda r: (r["val_loss"], r["trial"]))[:k]


def promote(results: list[dict], eta: int) -> list[dict]:
    """One rung of successive halving: the best ``len(results) // eta`` results (lowest ``val_loss``, ties
    broken by the smaller trial id), best first. Their configurations go on to the next rung."""
    if eta < 2:
        raise ValueError(f"need eta >= 2, got eta={eta}")
    return top_k(results, len(results) // eta)


def successive_halving(configs: list[dict], min_budget: int, eta: int = 3, max_budget: int | None = None,
                       view=None, progress: bool = True, **kwargs) -> list[list[dict]]:
    """Train all ``configs`` on ``min_budget``; keep the best ``1/eta``; multiply the budget by ``eta``; repeat.

    Stops when one configuration is left or the next budget would exceed ``max_budget``. Each rung retrains
    its survivors from scratch on the larger budget (no checkpoints: simpler, and what Hyperband allows).
    Returns the rungs, each a list of results.
    """
    if eta < 2 or min_budget < 1:
        raise ValueError(f"need eta >= 2 and min_budget >= 1, got eta={eta}, min_budget={min_budget}")
    rungs, alive, budget = [], list(configs), min_budget
    while True:
        res = run_trials(alive, budget, view, progress=progress, desc=f"rung {len(rungs)}: budget {budget}", **kwargs)
        rungs.append(res)
        if len(alive) // eta < 1 or (max_budget is not None and budget * eta > max_budget):
            return rungs
        survivors = {r["trial"] for r in promote(res, eta)}
        alive = [c for c in alive if c["trial"] in survivors]
        budget *= eta


def sh_total_budget(n_configs: int, min_budget: int, eta: int = 3, max_budget: int | None = None) -> int:
    """Samples that :func:`successive_halving` spends on ``n_configs`` (sum over rungs of configs x budget)."""
    total, n, budget = 0, n_configs, min_budget
    while True:
        total += n * budget
        keep = n // eta
        if keep < 1 or (max_budget is not None and budget * eta > max_budget):
            return total
        n, budget = keep, budget * eta


def hyperband_brackets(max_budget: int, min_budget: int, eta: int = 3) -> list[tuple[int, int]]:
    """``(n_configs, start_budget)`` of each Hyperband bracket, most exploratory first (Li et al. 2018)."""
    R = max_budget / min_budget
    s_max = int(math.floor(math.log(R, eta) + 1e-9))
    return [(int(math.ceil((s_max + 1) / (s + 1) * eta ** s)), int(round(max_budget * eta ** -s)))
            for s in range(s_max, -1, -1)]


def hyperband(max_budget: int, min_budget: int, eta: int = 3, view=None, seed: int = 0,
              **kwargs) -> list[list[list[dict]]]:
    """Successive halving in every bracket of :func:`hyperband_brackets`, with fresh configurations per bracket."""
    out, next_id = [], 0
    for b, (n, r) in enumerate(hyperband_brackets(max_budget, min_budget, eta)):
        configs = sample_configs(n, seed + 1 + b)
        for c in configs:  # unique trial ids across brackets
            c["trial"] = next_id
            next_id += 1
        out.append(successive_halving(configs, r, eta, max_budget, view, **kwargs))
    return out


# --------------------------------------------------------------------------- the learning-rate scaling exercise
def best_lr_per_batch(results: list[dict]) -> dict[int, float]:
    """For each batch size, the lr with the lowest validation loss."""
    out = {}
    for b in sorted({r["batch_size"] for r in results}):
        out[b] = best([r for r in results if r["batch_size"] == b])["lr"]
    return out


def scaling_exponent(results: list[dict]) -> float:
    """Slope of log(best lr) against log(batch size): about 1 for the linear rule, 0.5 for the square-root rule."""
    pairs = best_lr_per_batch(results)
    if len(pairs) < 2:
        raise ValueError("need results for at least two batch sizes")
    b = np.log(list(pairs))
    lr = np.log(list(pairs.values()))
    return float(np.polyfit(b, lr, 1)[0])


# --------------------------------------------------------------------------- plots
def plot_search(results: list[dict], ax=None, title: str = ""):
    """Validation loss against lr, coloured by batch size (diverged trials at the top, marked x)."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.2))
    finite = [r["val_loss"] for r in results if math.isfinite(r["val_loss"])]
    top = max(finite) * 1.1 if finite else 1.0
    sizes = sorted({r["batch_size"] for r in results})
    cmap = plt.get_cmap("viridis", max(2, len(sizes)))
    for i, b in enumerate(sizes):
        rs = [r for r in results if r["batch_size"] == b]
        ok = [r for r in rs if math.isfinite(r["val_loss"])]
        ax.scatter([r["lr"] for r in ok], [r["val_loss"] for r in ok], s=18, color=cmap(i), label=f"batch {b}")
        bad = [r for r in rs if not math.isfinite(r["val_loss"])]
        ax.scatter([r["lr"] for r in bad], [top] * len(bad), marker="x", color=cmap(i))
    bst = best(results)
    ax.scatter([bst["lr"]], [bst["val_loss"]], s=90, facecolors="none", edgecolors="r", label="best")
    ax.set_xscale("log")
    ax.set_xlabel("lr")
    ax.set_ylabel("validation loss")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return ax


def plot_rungs(rungs: list[list[dict]], ax=None, title: str = "successive halving"):
    """Each configuration's validation loss against budget; survivors continue to the right."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 3.2))
    by_trial: dict[int, list[tuple[int, float]]] = {}
    for rung in rungs:
        for r in rung:
            by_trial.setdefault(r["trial"], []).append((r["budget"], min(r["val_loss"], 5.0)))
    for pts in by_trial.values():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, lw=1, alpha=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("budget (training samples)")
    ax.set_ylabel("validation loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    return ax


def plot_timeline(results: list[dict], ax=None, title: str = ""):
    """Which engine ran which trial when: a bar per trial on its engine's row."""
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 1.8))
    engines = sorted({r["engine"] for r in results})
    for r in results:
        y = engines.index(r["engine"])
        ax.barh(y, r["end"] - r["start"], left=r["start"], height=0.6, edgecolor="k", lw=0.5)
    ax.set_yticks(range(len(engines)), [f"engine {e}" for e in engines], fontsize=8)
    ax.set_xlabel("seconds since submission")
    ax.set_title(title, fontsize=9)
    return ax
