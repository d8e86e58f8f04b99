"""Feeding the model: a sharded on-disk array format, and measurements of the input pipeline.

The format (one directory)::

    index.json                      # keys, dtypes, per-sample shapes, per-shard counts, a content hash
    shard-00000-inputs.npy          # samples 0 .. samples_per_shard-1 of key "inputs", stacked on axis 0
    shard-00000-targets.npy
    shard-00001-inputs.npy ...

* :func:`write_shards` writes it from any iterable of chunks (a dict of arrays, a tuple of arrays or one
  array, each stacked on axis 0); :func:`convert` does the same for a generator of ``(inputs, targets)``;
  :func:`from_arrays` shards the dict that a case-study loader returns.
* :class:`ShardedArrayDataset` gives rank ``r`` of ``world_size`` a contiguous range of samples
  (:func:`rank_range`) and opens, with ``numpy`` memory maps, only the shards that overlap it.
  Nothing is read until a sample is asked for, and then only that sample's bytes.

Measurements (never asserted, only printed and plotted):

* :func:`time_loader`, :func:`time_step`, :func:`time_loader_and_step`, :func:`input_bound_report`:
  does a training step wait for data?
* :func:`measure_loader_settings`: DataLoader ``num_workers``, ``prefetch_factor``, ``pin_memory``.

Many ranks reading one file at once, against each rank reading its own file, is measured by
:mod:`ddlcourse.storage`.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader

from ddlcourse import dist
from ddlcourse.data import toy
from ddlcourse.data.cache import cache_root
from ddlcourse.device import now

FORMAT = "ddlcourse-shards/1"
INDEX = "index.json"


class ShardError(ValueError):
    """Bad input to the writer, or a directory that is not (or no longer) a valid sharded data set."""


# --------------------------------------------------------------------------- writing
def _as_chunk(item, keys: tuple[str, ...] | None) -> dict[str, np.ndarray]:
    """One chunk as ``{key: array}``; tensors become numpy arrays; all keys share the leading length."""
    if isinstance(item, dict):
        chunk = dict(item)
    elif isinstance(item, (tuple, list)):
        names = keys or (("inputs", "targets") if len(item) == 2 else tuple(f"a{i}" for i in range(len(item))))
        if len(names) != len(item):
            raise ShardError(f"a chunk has {len(item)} arrays but keys={names!r} names {len(names)}")
        chunk = dict(zip(names, item))
    else:
        chunk = {(keys or ("x",))[0]: item}
    out = {}
    for k, v in chunk.items():
        if hasattr(v, "detach"):  # a torch tensor
            v = v.detach().cpu().numpy()
        v = np.asarray(v)
        if v.ndim == 0:
            raise ShardError(f"array {k!r} is a scalar; chunks must be stacked samples (axis 0 = sample)")
        out[k] = v
    lengths = {k: len(v) for k, v in out.items()}
    if len(set(lengths.values())) != 1:
        raise ShardError(f"arrays of one chunk must have the same number of samples (axis 0), got {lengths}")
    return out


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_shards(chunks: Iterable, directory: str | os.PathLike, samples_per_shard: int,
                 keys: tuple[str, ...] | None = None, overwrite: bool = False) -> dict:
    """Write ``chunks`` (each a dict of arrays, a tuple of arrays or one array; axis 0 = sample) as shards.

    Every shard but the last holds exactly ``samples_per_shard`` samples, whatever the chunk sizes.
    Returns the index (also written to ``directory/index.json`` last, so a crash never leaves a valid-looking
    but incomplete data set).
    """
    if not (isinstance(samples_per_shard, int) and samples_per_shard >= 1):
        raise ShardError(f"samples_per_shard must be a positive int, got {samples_per_shard!r}")
    d = Path(directory)
    if (d / INDEX).exists() and not overwrite:
        raise ShardError(f"{d} already holds a sharded data set; pass overwrite=True to replace it")
    d.mkdir(parents=True, exist_ok=True)
    for old in list(d.glob("shard-*.npy")) + [d / INDEX]:
        old.unlink(missing_ok=True)

    spec: dict[str, dict] | None = None     # key -> dtype and per-sample shape (fixed by the first chunk)
    pending: list[dict[str, np.ndarray]] = []
    n_pending = 0
    shards: list[dict] = []

    def flush(n: int) -> None:
        nonlocal pending, n_pending
        joined = {k: np.concatenate([p[k] for p in pending]) for k in spec}
        sid = len(shards)
        files, hashes = {}, {}
        for k, arr in joined.items():
            name = f"shard-{sid:05d}-{k}.npy"
            np.save(d / name, np.ascontiguousarray(arr[:n]))
            files[k], hashes[k] = name, _file_hash(d / name)
        shards.append({"id": sid, "count": n, "files": files, "sha256": hashes})
        rest = {k: v[n:] for k, v in joined.items()}
        pending, n_pending = ([rest] if len(next(iter(rest.values()))) else []), len(next(iter(rest.values())))

    for item in chunks:
        chunk = _as_chunk(item, keys)
        if spec is None:
            spec = {k: {"dtype": v.dtype.str, "shape": list(v.shape[1:])} for k, v in chunk.items()}
        got = {k: {"dtype": v.dtype.str, "shape": list(v.shape[1:])} for k, v in chunk.items()}
        if got != spec:
            raise ShardError(f"chunk does not match the first one: expected {spec}, got {got}")
        pending.append(chunk)
        n_pending += len(next(iter(chunk.values())))
        while n_pending >= samples_per_shard:
            flush(samples_per_shard)
    if spec is None:
        raise ShardError("no data: the iterable of chunks was empty")
    if n_pending:
        flush(n_pending)

    content = hashlib.sha256("".join(h for s in shards for h in sorted(s["sha256"].values())).encode())
    index = {"format": FORMAT, "keys": list(spec), "spec": spec, "samples_per_shard": samples_per_shard,
             "count": sum(s["count"] for s in shards), "shards": shards, "content_sha256": content.hexdigest()}
    tmp = d / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    tmp.replace(d / INDEX)
    return index


def convert(generator: Iterable, directory: str | os.PathLike, samples_per_shard: int,
            keys: tuple[str, str] = ("inputs", "targets"), max_samples: int | None = None,
            overwrite: bool = False) -> dict:
    """Turn any generator of ``(inputs, targets)`` chunks (numpy arrays or tensors) into the sharded format.

    ``max_samples`` stops after that many samples (the last chunk is cut), handy for a small sample of a
    large or endless generator.
    """
    def chunks():
        seen = 0
        for item in generator:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ShardError("convert() expects a generator of (inputs, targets) pairs; "
                                 f"got a {type(item).__name__}. Use write_shards() for other layouts.")
            x, y = item
            if max_samples is not None:
                take = max_samples - seen
                if take <= 0:
                    return
                x, y = x[:take], y[:take]
            seen += len(x)
            yield (x, y)
    return write_shards(chunks(), directory, samples_per_shard, keys=keys, overwrite=overwrite)


def from_arrays(arrays: dict, directory: str | os.PathLike, samples_per_shard: int, overwrite: bool = False) -> dict:
    """Shard a dict of per-sample arrays, such as a case-study loader returns (``maize.load``, ``driving.generate``).

    Entries that are not per-sample arrays (scalars such as a timing, or arrays of another length) are left
    out; the index lists the keys that were kept.
    """
    arrs = {k: np.asarray(v) for k, v in arrays.items()}
    lengths = collections.Counter(len(v) for v in arrs.values() if v.ndim >= 1)
    if not lengths:
        raise ShardError(f"no per-sample arrays among {sorted(arrays)}")
    n = lengths.most_common(1)[0][0]
    keep = {k: v for k, v in arrs.items() if v.ndim >= 1 and len(v) == n}
    return write_shards([keep], directory, samples_per_shard, overwrite=overwrite)


def shapes_chunks(n: int, chunk: int = 256, size: int = 16, seed: int = 0):
    """A generator of ``(X, y)`` chunks of :func:`ddlcourse.data.toy.shapes` (chunk ``k`` seeded ``seed + k``)."""
    for k, start in enumerate(range(0, n, chunk)):
        X, y = toy.shapes(min(chunk, n - start), size=size, seed=seed + k)  # X: (chunk, 1, size, size)
        yield X.numpy(), y.numpy()


def read_index(directory: str | os.PathLike) -> dict:
    p = Path(directory) / INDEX
    if not p.exists():
        raise ShardError(f"{directory} has no {INDEX}: write it with datapipe.write_shards() or convert()")
    index = json.loads(p.read_text())
    if index.get("format") != FORMAT:
        raise ShardError(f"{p} has format {index.get('format')!r}, expected {FORMAT!r}")
    return index


def verify(directory: str | os.PathLike) -> bool:
    """Recompute every shard's hash and compare with the index (True when the data set is intact)."""
    index = read_index(directory)
    for s in index["shards"]:
        for k, name in s["files"].items():
            p = Path(directory) / name
            if not p.exists() or _file_hash(p) != s["sha256"][k]:
                return False
    return True


# --------------------------------------------------------------------------- reading
def rank_range(n: int, rank: int, world_size: int, equal: bool = True) -> tuple[int, int]:
    """Samples ``[start, stop)`` of rank ``rank``: contiguous blocks.

    ``equal=True`` gives every rank ``n // world_size`` samples (the remainder is dropped, so every rank
    takes the same number of steps); ``equal=False`` spreads the remainder (sizes differ by at most 1).
    """
    if not (world_size >= 1 and 0 <= rank < world_size):
        raise ShardError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if n < world_size:
        raise ShardError(f"{n} samples cannot be split over {world_size} ranks; write more data or use fewer ranks")
    if equal:
        per = n // world_size
        return rank * per, (rank + 1) * per
    return rank * n // world_size, (rank + 1) * n // world_size


class ShardedArrayDataset:
    """Rank ``rank``'s samples of a sharded data set, read through memory maps.

    ``ds[i]`` is a tuple of arrays (one per key, in index order) for this rank's ``i``-th sample; it works as a
    map-style dataset for ``torch.utils.data.DataLoader``. Only the shards overlapping this rank's range are
    ever opened (see ``shards_opened``); they are opened lazily, so the object pickles cheaply to workers.

    The trade-off (notebook 27): rank ``r`` reads the **same** contiguous block in every epoch, and with
    ``equal=True`` the last ``count % world_size`` samples are never read. That buys locality (each rank
    opens about ``1 / world_size`` of the shards) at the price of notebook 03's rule: there is no shared
    per-epoch permutation, so a run is not sample-for-sample the serial run. For that rule, read the
    indices of :func:`ddlcourse.sharding.sharded_batches` from ``ShardedArrayDataset(directory)`` (the whole
    set): every rank then touches most shards (:func:`shard_ids`).
    """

    def __init__(self, directory: str | os.PathLike, rank: int = 0, world_size: int = 1,
                 keys: tuple[str, ...] | None = None, equal: bool = True):
        self.directory = Path(directory)
        self.index = read_index(directory)
        self.keys = tuple(keys or self.index["keys"])
        missing = set(self.keys) - set(self.index["keys"])
        if missing:
            raise ShardError(f"keys {sorted(missing)} not in the data set; it has {self.index['keys']}")
        self.rank, self.world_size = rank, world_size
        self.start, self.stop = rank_range(self.index["count"], rank, world_size, equal)
        counts = [s["count"] for s in self.index["shards"]]
        self._bounds = np.concatenate([[0], np.cumsum(counts)])   # shard s holds [bounds[s], bounds[s+1])
        first = int(np.searchsorted(self._bounds, self.start, side="right") - 1)
        last = int(np.searchsorted(self._bounds, self.stop - 1, side="right") - 1)
        self.my_shards = list(range(first, last + 1))
        self._maps: dict[tuple[int, str], np.ndarray] = {}
        self.shards_opened: set[int] = set()

    def __len__(self) -> int:
        return self.stop - self.start

    def __getstate__(self):  # workers reopen their own maps
        state = dict(self.__dict__)
        state["_maps"], state["shards_opened"] = {}, set()
        return state

    def _map(self, sid: int, key: str) -> np.ndarray:
        m = self._maps.get((sid, key))
        if m is None:
            m = np.load(self.directory / self.index["shards"][sid]["files"][key], mmap_mode="r")
            self._maps[(sid, key)] = m
            self.shards_opened.add(sid)
        return m

    def global_index(self, i: int) -> int:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} outside this rank's {len(self)} samples")
        return self.start + (i % len(self))

    def __getitem__(self, i: int) -> tuple[np.ndarray, ...]:
        g = self.global_index(i)
        sid = int(np.searchsorted(self._bounds, g, side="right") - 1)
        j = g - self._bounds[sid]
        return tuple(np.array(self._map(sid, k)[j]) for k in self.keys)  # a copy: memmaps are read-only

    def arrays(self) -> tuple[np.ndarray, ...]:
        """All of this rank's samples at once (one contiguous read per shard), one array per key."""
        out = []
        for k in self.keys:
            parts = []
            for sid in self.my_shards:
                lo = max(self.start, self._bounds[sid]) - self._bounds[sid]
                hi = min(self.stop, self._bounds[sid + 1]) - self._bounds[sid]
                parts.append(np.asarray(self._map(sid, k)[lo:hi]))
            out.append(np.concatenate(parts))
        return tuple(out)


def shard_ids(index: dict, indices) -> set[int]:
    """The shards that hold the samples ``indices`` (global sample numbers) of the data set of ``index``."""
    bounds = np.cumsum([s["count"] for s in index["shards"]])     # shard s holds [bounds[s-1], bounds[s])
    idx = np.asarray(indices, dtype=np.int64).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= bounds[-1]):
        raise ShardError(f"sample indices must lie in [0, {int(bounds[-1])})")
    return {int(s) for s in np.searchsorted(bounds, idx, side="right")}


def rank_share(directory: str | os.PathLike) -> dict:
    """Run on every MPI rank: which samples and shards this rank reads (its dataset opens nothing else)."""
    ds = ShardedArrayDataset(directory, dist.rank(), dist.world_size())
    arrays = ds.arrays()               # all of this rank's samples: one contiguous read per shard it overlaps
    return {"rank": ds.rank, "start": ds.start, "stop": ds.stop, "my_shards": ds.my_shards,
            "shards_opened": sorted(ds.shards_opened), "n_read": len(arrays[0]),
            "sample_shape": tuple(arrays[0].shape[1:])}


def scratch_dir(name: str) -> Path:
    """A fresh folder under the data cache (``$DDLCOURSE_DATA_DIR``): point that at node-local disk or the
    parallel file system on a cluster to measure either."""
    root = cache_root() / "scratch"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))


class SlowReads:
    """Wrap a dataset so each sample costs ``latency_s`` of waiting, like a read from a remote file system.

    The wait is a sleep, not computation: it models I/O latency, which workers can overlap even when no
    CPU core is free. (Decoding/augmentation is computation; workers only help it when cores are free.)
    """

    def __init__(self, dataset, latency_s: float):
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.dataset, self.latency_s = dataset, latency_s

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        time.sleep(self.latency_s)
        return self.dataset[i]


# --------------------------------------------------------------------------- does the step wait for data?
@dataclass
class LoopTimes:
    seconds: float      # wall time of the timed batches
    batches: int
    samples: int

    @property
    def per_batch(self) -> float:
        return self.seconds / self.batches

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds


def _batch_len(batch) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return len(first)


def time_loader(loader, n_batches: int, warmup: int | None = None) -> LoopTimes:
    """The loader alone: iterate ``n_batches`` after ``warmup`` untimed ones (worker start-up goes there)."""
    return time_loader_and_step(loader, None, n_batches, warmup)


# ``device``, below: where ``step`` runs. The clock (:func:`ddlcourse.device.now`) waits for that device's queued
# work before each reading, so a GPU step is timed when it has run, not when it was launched.



def time_step(step: Callable, batch, n_steps: int, warmup: int = 1, device=None) -> LoopTimes:
    """The step alone: ``step(batch)`` on one batch already in memory."""
    for _ in range(warmup):
        step(batch)
    t0 = now(device)
    for _ in range(n_steps):
        step(batch)
    return LoopTimes(now(device) - t0, n_steps, n_steps * _batch_len(batch))


def time_loader_and_step(loader, step: Callable | None, n_batches: int, warmup: int | None = None,
                         device=None) -> LoopTimes:
    """Both together, as in training: ``for batch in loader: step(batch)``.

    ``warmup`` untimed batches first; by default one per worker (at least 1), so that worker start-up and
    the filling of the prefetch queue are not counted.
    """
    if warmup is None:
        warmup = max(1, getattr(loader, "num_workers", 0))
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    it = iter(loader)
    try:
        for _ in range(warmup):
            b = next(it)
            if step:
                step(b)
        t0, samples = now(device), 0
        for _ in range(n_batches):
            b = next(it)
            if step:
                step(b)
            samples += _batch_len(b)
    except StopIteration:
        raise ValueError(f"the loader has fewer than warmup + n_batches = {warmup + n_batches} batches") from None
    finally:
        del it  # shut workers down now
    return LoopTimes(now(device) - t0, n_batches, samples)


def input_bound_report(loader, step: Callable, n_batches: int, warmup: int | None = None, device=None) -> dict:
    """Time the loader alone, the step alone and both; say whether the step waits for data.

    Without overlap ``both ~ loader + step``; with perfect overlap (prefetching) ``both ~ max(loader, step)``.
    ``wait_fraction`` is the share of the training loop not spent in the step.
    """
    loader_t = time_loader(loader, n_batches, warmup)
    batch = next(iter(loader))
    step_t = time_step(step, batch, n_batches, 1 if warmup is None else warmup, device)
    both_t = time_loader_and_step(loader, step, n_batches, warmup, device)
    wait = max(0.0, 1 - step_t.per_batch / both_t.per_batch)
    return {"loader_s": loader_t.per_batch, "step_s": step_t.per_batch, "both_s": both_t.per_batch,
            "wait_fraction": wait, "input_bound": loader_t.per_batch > step_t.per_batch,
            "samples_per_s": both_t.samples_per_s}


def format_report(r: dict) -> str:
    return (f"loader alone {1e3 * r['loader_s']:7.1f} ms/batch | step alone {1e3 * r['step_s']:7.1f} ms/batch | "
            f"both {1e3 * r['both_s']:7.1f} ms/batch | waiting for data {r['wait_fraction']:.0%} of the loop")


def measure_loader_settings(dataset, step: Callable | None, batch_size: int, settings: list[dict],
                            n_batches: int, warmup: int | None = None, device=None) -> list[dict]:
    """Throughput of ``DataLoader(dataset, batch_size, **s)`` for each ``s`` in ``settings``.

    Each record has the settings, ``loader_samples_per_s`` (loader alone) and ``train_samples_per_s``
    (loader + ``step``). ``pin_memory=True`` only matters with an accelerator; without one it is skipped
    (recorded with ``skipped``), because torch ignores it on CPU.
    """
    has_accel = torch.cuda.is_available()
    out = []
    for s in settings:
        s = dict(s)
        rec = {"name": s.pop("name", None) or ", ".join(f"{k}={v}" for k, v in s.items()) or "defaults", **s}
        if s.get("pin_memory") and not has_accel:
            out.append({**rec, "skipped": "pin_memory needs a GPU (pinned host memory speeds host-to-device copies)"})
            continue
        if s.get("num_workers", 0) > 0:
            s.setdefault("persistent_workers", True)   # start the workers once for both timings
        else:
            s.pop("prefetch_factor", None)  # only valid with workers
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=True, **s)
        lt = time_loader(loader, n_batches, warmup)
        rec["loader_samples_per_s"] = lt.samples_per_s
        if step is not None:
            bt = time_loader_and_step(loader, step, n_batches, warmup, device)
            rec["train_samples_per_s"] = bt.samples_per_s
        del loader                                      # stops its persistent workers
        out.append(rec)
    return out


def format_settings(records: list[dict]) -> str:
    lines = [f"{'DataLoader settings':<40} {'loader samples/s':>17} {'train samples/s':>16}"]
    for r in records:
        if "skipped" in r:
            lines.append(f"{r['name']:<40} {'skipped: ' + r['skipped']}")
            continue
        tr = r.get("train_samples_per_s", float("nan"))
        lines.append(f"{r['name']:<40} {r['loader_samples_per_s']:>17.0f} {tr:>16.0f}")
    return "\n".join(lines)


def plot_settings(records: list[dict], ax=None):
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    rows = [r for r in records if "skipped" not in r]
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 2.6))
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["loader_samples_per_s"] for r in rows], 0.4, label="loader alone")
    ax.barh(y + 0.2, [r.get("train_samples_per_s", 0) for r in rows], 0.4, label="loader + step")
    ax.set_yticks(y, [r["name"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("samples / s")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return ax
