"""Seeded, rank-sharded, cached generation of a case study's data set.

A generator describes its data set by a name, a version string and its settings (a dict). Items are made
in fixed-size *chunks* (``chunk_size`` items, independent of the number of ranks), each from its own seed
``seed + chunk_id``, so:

* the same settings give the same data, whatever the number of ranks (determinism);
* rank ``r`` of ``N`` makes or loads only chunks ``r, r+N, r+2N, ...`` (no overlap, nothing missing);
* a chunk is stored as ``<cache>/<name>-<key>/chunk-<id>.npz``; ``key`` hashes the version and settings,
  so a changed generator never reads a stale cache;
* a corrupted chunk file is reported, removed and regenerated; the others are kept.

Usage (inside a generator module)::

    arrays = load_or_make("seismic", VERSION, settings, make_chunk, rank=r, world_size=n)

where ``make_chunk(chunk_id, n_items, rng) -> dict[str, np.ndarray]`` (arrays stacked on axis 0) and the
result concatenates this rank's chunks.

Where the cache lives (:func:`cache_root`): ``$DDLCOURSE_DATA_DIR``, else ``~/.cache/ddlcourse/data``. At cluster
scale the labs' data sets take tens of GB there (``python -m ddlcourse plan --scale cluster``, column ``disk``), more
than a cluster's home quota: point ``DDLCOURSE_DATA_DIR`` at the scratch file system, one folder every node sees
(the Slurm templates of ``env/slurm/`` do it). A write that finds the disk or the quota full says so.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np


class DataError(ValueError):
    """Bad generator settings, or more ranks than data shards."""


def cache_root() -> Path:
    """``$DDLCOURSE_DATA_DIR``, else ``$XDG_CACHE_HOME/ddlcourse/data`` (``~/.cache/ddlcourse/data``)."""
    d = os.environ.get("DDLCOURSE_DATA_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ddlcourse", "data")
    return Path(d)


def settings_key(version: str, settings: dict) -> str:
    """Short hash of the generator version and its settings (JSON, sorted keys)."""
    blob = json.dumps({"version": version, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def n_chunks(n_items: int, chunk_size: int) -> int:
    if n_items < 1 or chunk_size < 1:
        raise DataError(f"need n_items >= 1 and chunk_size >= 1, got {n_items}, {chunk_size}")
    return -(-n_items // chunk_size)


def chunks_of_rank(n_items: int, chunk_size: int, rank: int, world_size: int) -> list[int]:
    """Chunk ids that rank ``rank`` of ``world_size`` owns (round-robin)."""
    total = n_chunks(n_items, chunk_size)
    if world_size > total:
        raise DataError(
            f"{world_size} ranks but only {total} data shard(s) of {chunk_size} items ({n_items} items): "
            f"use at most {total} ranks, or a larger data set (scale profile) / smaller chunk_size")
    if not 0 <= rank < world_size:
        raise DataError(f"rank {rank} outside world of size {world_size}")
    return list(range(rank, total, world_size))


def chunk_items(chunk_id: int, n_items: int, chunk_size: int) -> int:
    return min(chunk_size, n_items - chunk_id * chunk_size)


def _atomic_save(path: Path, arrays: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.npz")
    try:
        np.savez(tmp, **arrays)
    except OSError as e:
        tmp.unlink(missing_ok=True)             # a half-written chunk would hold on to the space that ran out
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, f"{e.strerror} while writing the data cache {path.parent}: set "
                                   "DDLCOURSE_DATA_DIR to a folder on a file system with room (on a cluster: "
                                   "scratch, not $HOME); `python -m ddlcourse plan --scale SCALE` prints the disk "
                                   "each notebook and lab needs") from e
        raise
    os.replace(tmp, path)


def _load(path: Path) -> dict | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        warnings.warn(f"cache file {path} is corrupt ({type(e).__name__}: {e}); regenerating it", stacklevel=3)
        path.unlink(missing_ok=True)
        return None


def load_or_make(name: str, version: str, settings: dict,
                 make_chunk: Callable[[int, int, np.random.Generator], dict],
                 rank: int = 0, world_size: int = 1, use_cache: bool = True,
                 root: Path | str | None = None, progress: Callable[[int, int], None] | None = None) -> dict:
    """This rank's share of the data set, concatenated; see the module docstring.

    ``settings`` must contain ``n_items``, ``chunk_size`` and ``seed``.
    """
    for k in ("n_items", "chunk_size", "seed"):
        if k not in settings:
            raise DataError(f"settings of {name!r} lack {k!r}")
    n, cs, seed = int(settings["n_items"]), int(settings["chunk_size"]), int(settings["seed"])
    mine = chunks_of_rank(n, cs, rank, world_size)
    folder = Path(root or cache_root()) / f"{name}-{settings_key(version, settings)}"
    if use_cache:
        folder.mkdir(parents=True, exist_ok=True)
        meta = folder / "settings.json"
        if not meta.exists():
            meta.write_text(json.dumps({"name": name, "version": version, "settings": settings}, indent=1, default=str))
    parts = []
    for i, cid in enumerate(mine):
        path = folder / f"chunk-{cid:05d}.npz"
        arrays = _load(path) if use_cache and path.exists() else None
        if arrays is None:
            arrays = make_chunk(cid, chunk_items(cid, n, cs), np.random.default_rng([seed, cid]))
            if use_cache:
                _atomic_save(path, arrays)
        parts.append(arrays)
        if progress:
            progress(i + 1, len(mine))
    keys = parts[0].keys()
    return {k: np.concatenate([p[k] for p in parts]) for k in keys}
