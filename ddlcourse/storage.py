"""Notebook 27 · storage contention: many ranks reading one file at once, against each rank reading its own.

:func:`make_contention_files` writes one shared file of ``max_ranks`` slices and one file per rank;
:func:`read_contention` runs on every MPI rank and times the first ``k`` ranks reading at once with one of
:data:`PATTERNS`, from storage rather than the page cache. Timings are printed and plotted, never asserted.
Put the files on the storage to measure: :func:`ddlcourse.datapipe.scratch_dir` makes a folder under
``$DDLCOURSE_DATA_DIR`` (node-local disk or the parallel file system).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ddlcourse import dist

PATTERNS = ("one_file_whole", "one_file_slices", "own_files")


def make_contention_files(directory: str | os.PathLike, max_ranks: int, mb_per_rank: float) -> Path:
    """A shared file of ``max_ranks`` slices of ``mb_per_rank`` MB, and one file of that size per rank."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    nbytes = int(mb_per_rank * 2**20)
    rng = np.random.default_rng(0)
    block = rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes()  # incompressible
    def write(path, copies):
        with open(path, "wb") as f:
            for _ in range(copies):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())  # written back to storage: only clean pages can be dropped from the cache
    write(d / "shared.bin", max_ranks)
    for r in range(max_ranks):
        write(d / f"rank-{r:03d}.bin", 1)
    return d


def _drop_cache(path: Path) -> None:
    """Ask the kernel to forget this file's cached pages, so the next read comes from storage."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read(path: Path, offset: int, nbytes: int, block: int = 4 << 20) -> int:
    buf = bytearray(block)
    done = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while done < nbytes:
            n = f.readinto(memoryview(buf)[: min(block, nbytes - done)])
            if not n:
                break
            done += n
    return done


def read_contention(directory: str | os.PathLike, pattern: str, k: int, cold: bool = True, repeats: int = 2):
    """Run on every MPI rank: the first ``k`` ranks read at once with ``pattern``; rank 0 returns a record.

    Patterns: ``one_file_whole`` (every rank reads all of ``shared.bin``: the naive "load everything, keep
    my part"), ``one_file_slices`` (each rank reads its own slice of ``shared.bin``), ``own_files`` (each rank
    reads its own file). ``cold`` drops the files from the page cache first (``posix_fadvise``), so reads hit
    storage. The record holds the slowest rank's time (the median of ``repeats``), bytes read, and bandwidth.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; use one of {PATTERNS}")
    comm, _ = dist.subgroup(k)
    if comm is None:
        return None
    r = comm.Get_rank()
    d = Path(directory)
    slice_bytes = (d / "rank-000.bin").stat().st_size
    if pattern == "own_files":
        path, offset, nbytes = d / f"rank-{r:03d}.bin", 0, slice_bytes
    elif pattern == "one_file_slices":
        path, offset, nbytes = d / "shared.bin", r * slice_bytes, slice_bytes
    else:
        path, offset, nbytes = d / "shared.bin", 0, k * slice_bytes  # the whole data set of k ranks
    times = []
    for _ in range(repeats):
        if cold:
            _drop_cache(path)
        comm.Barrier()
        t0 = time.perf_counter()
        got = _read(path, offset, nbytes)
        dt = time.perf_counter() - t0
        times.append(comm.allreduce(dt, op=MPI.MAX))  # the slowest rank sets the pace
        comm.Barrier()
    t = float(np.median(times))
    total = comm.allreduce(got)
    if r != 0:
        return None
    return {"pattern": pattern, "ranks": k, "seconds": t, "bytes_total": total, "useful_bytes": k * slice_bytes,
            "MB_per_s": total / t / 2**20, "useful_MB_per_s": k * slice_bytes / t / 2**20}


def format_contention(records: list[dict]) -> str:
    lines = [f"{'pattern':<16} {'ranks':>5} {'slowest rank s':>14} {'MB read':>8} {'MB/s read':>10} {'useful MB/s':>11}"]
    for r in records:
        lines.append(f"{r['pattern']:<16} {r['ranks']:>5} {r['seconds']:>14.4f} {r['bytes_total'] / 2**20:>8.0f} "
                     f"{r['MB_per_s']:>10.0f} {r['useful_MB_per_s']:>11.0f}")
    return "\n".join(lines)


def plot_contention(records: list[dict], ax=None):
    import matplotlib.pyplot as plt  # lazy: plotting only; matplotlib is slow to import
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.0))
    for p in PATTERNS:
        rows = sorted((r for r in records if r["pattern"] == p), key=lambda r: r["ranks"])
        if rows:
            ax.plot([r["ranks"] for r in rows], [r["useful_MB_per_s"] for r in rows], "o-", label=p)
    ax.set_xlabel("ranks reading at once")
    ax.set_ylabel("useful MB/s (all ranks)")
    ax.set_xticks(sorted({r["ranks"] for r in records}))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax
