"""Checkers of notebooks/26_native_sharding_checkpoints.ipynb: which rows of a parameter a rank holds, and the
resharding of a row-sharded checkpoint the learner builds on the ranks."""
import os

from ddlcourse import dcp
from ddlcourse.exercises.solutions.native_sharding_checkpoints import RESHARD_VARIANTS, SHARD_VARIANTS
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, raised
from ddlcourse.training import run_dir

# (rows, ranks): even splits, uneven ones, more ranks than rows
_CASES = [(64, 4), (10, 4), (10, 3), (3, 4), (7, 2), (1, 1), (0, 2), (9, 4)]


def _all(fn):
    return [tuple(int(v) for v in fn(n, w, r)) for n, w in _CASES for r in range(w)]


SHARD_HINTS = {
    "floor": "with floor(n / ranks) rows per rank the last rows belong to nobody: use ceil(n / ranks)",
    "remainder_to_last": "torch.chunk (and FSDP2) does not give the remainder to the last rank: every rank gets "
                         "ceil(n / ranks) rows, the last ones what is left",
    "array_split": "that is numpy's array_split (the first ranks get one row more); FSDP2 splits like torch.chunk: "
                   "ceil(n / ranks) rows per rank",
    "unclamped": "clamp start and stop to n_rows: the last ranks may hold fewer rows, or none",
}


@code_exercise("shard_range")
def check_shard_range(fn) -> Verdict:
    """``fn(n_rows, n_ranks, rank) -> (start, stop)``: the rows of a dim-0 shard rank ``rank`` holds (torch.chunk)."""
    wrong = {hint: _all(SHARD_VARIANTS[kind]) for kind, hint in SHARD_HINTS.items()}
    return diagnose(_all(fn), _all(dcp.shard_range), wrong, what="(start, stop) per rank and case")


# --------------------------------------------------------------------------- build it: reshard a checkpoint by hand
# (rows, old files): the notebook's 2 files, uneven splits, an old file with no rows (11 rows in 5: 3+3+3+2+0);
# every new rank of 2, 3 or 4 holds at least one row
_RESHARD_CASES = [(12, 2), (10, 3), (7, 4), (11, 5)]
_RESHARD_COLS = 3


def _reshard_run(fn, folder, rank, n_ranks, record):
    """Per case: the rows ``fn`` returns (a list, or an error text) and the old files it loaded (indices)."""
    import torch
    out = []
    for n_rows, n_old in _RESHARD_CASES:
        paths = [os.path.join(folder, f"case{n_rows}x{n_old}", f"rank_{i}.pt") for i in range(n_old)]
        loaded, real_load = [], torch.load

        def load(f, *a, **k):
            loaded.append(paths.index(str(f)) if str(f) in paths else str(f))
            return real_load(f, *a, **k)
        if record:
            torch.load = load
        try:
            rows = fn(list(paths), n_rows, rank, n_ranks)
            rows = rows.tolist() if torch.is_tensor(rows) else f"a {type(rows).__name__}, not a tensor"
        except NotImplementedError:
            rows = "not written yet"
        except Exception as e:          # a wrong slice may fail on some rank only: every rank must still answer
            rows = f"{type(e).__name__}: {e}"
            raised(e)
        finally:
            torch.load = real_load
        out.append((rows, sorted(set(loaded), key=str)))
    return out


@code_exercise("reshard_rows", distributed=True, ranks=(2, 3))
def check_reshard_rows(fn, **_) -> Verdict:
    """On every rank of M: ``fn(paths, n_rows, rank, M)`` on checkpoints of N row-sharded files (written by rank 0
    in a fresh folder of the results area); the rows and the files each rank read, gathered from all ranks (every
    rank gives the same verdict), against the full tensor and the typical mistakes."""
    import shutil

    import torch
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    comm = MPI.COMM_WORLD
    r, m = comm.Get_rank(), comm.Get_size()
    folder = None
    if r == 0:
        folder = str(run_dir("selfcheck-reshard"))
        for n_rows, n_old in _RESHARD_CASES:
            full = torch.arange(n_rows * _RESHARD_COLS, dtype=torch.float32).reshape(n_rows, _RESHARD_COLS)
            os.makedirs(os.path.join(folder, f"case{n_rows}x{n_old}"))
            for i in range(n_old):
                a, b = dcp.shard_range(n_rows, n_old, i)
                torch.save(full[a:b].clone(), os.path.join(folder, f"case{n_rows}x{n_old}", f"rank_{i}.pt"))
    folder = comm.bcast(folder)
    try:
        got = comm.allgather(_reshard_run(fn, folder, r, m, record=True))
        wrong = {kind: comm.allgather(_reshard_run(RESHARD_VARIANTS[kind], folder, r, m, record=False))
                 for kind in ("inclusive", "one_file", "array_split")}
    finally:
        comm.Barrier()
        if r == 0:
            shutil.rmtree(folder, ignore_errors=True)
    if any(c[0] == "not written yet" for per_rank in got for c in per_rank):
        raise NotImplementedError       # the template, on every rank: run_checker says "not written yet"
    rows = lambda res: [[c[0] for c in per_rank] for per_rank in res]  # noqa: E731
    ref = []
    for rank in range(m):
        per_case = []
        for n_rows, n_old in _RESHARD_CASES:
            a, b = dcp.shard_range(n_rows, m, rank)
            per_case.append(torch.arange(n_rows * _RESHARD_COLS, dtype=torch.float32)
                            .reshape(n_rows, _RESHARD_COLS)[a:b].tolist())
        ref.append(per_case)
    if rows(got) != ref:
        hints = {
            "inclusive": "off by one: old file i holds rows [a, b) with b excluded; take rows lo - a up to, not "
                         "including, hi - a of it",
            "one_file": "you assumed one old file per new rank: with N old files and M new ranks a new rank may "
                        "need part of one old file, or rows of several",
            "array_split": "the split rule differs from the save's: the old files were written with torch.chunk's "
                           "rule (ceil(n / N) rows each, the last ones less), not numpy's array_split",
        }
        for kind, hint in hints.items():
            if rows(got) == rows(wrong[kind]):
                return Verdict(False, hint)
        for rank in range(m):
            for (n_rows, n_old), g, f in zip(_RESHARD_CASES, rows(got)[rank], ref[rank]):
                if g != f:
                    shape = f"{len(g)} rows" if isinstance(g, list) else g
                    return Verdict(False, f"{n_rows} rows saved in {n_old} files, loaded on {m} ranks: rank {rank} "
                                          f"returned {shape}, expected rows {list(dcp.shard_range(n_rows, m, rank))} "
                                          f"({len(f)} rows)")
    for rank, per_rank in enumerate(got):
        for (n_rows, n_old), (_, loaded) in zip(_RESHARD_CASES, per_rank):
            start, stop = dcp.shard_range(n_rows, m, rank)
            need = [i for i in range(n_old) if max(start, dcp.shard_range(n_rows, n_old, i)[0])
                    < min(stop, dcp.shard_range(n_rows, n_old, i)[1])]
            extra = [i for i in loaded if i not in need]
            if extra:
                return Verdict(False, f"the rows are right, but read only the old files that hold some of your rows: "
                                      f"with {n_rows} rows in {n_old} files, rank {rank} of {m} needs files {need} "
                                      f"and read {loaded}")
    return Verdict(True)
