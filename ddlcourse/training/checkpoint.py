"""Checkpoints: one atomic write and one readable-error read, and the per-epoch checkpointer of a case.

:func:`atomic_save` and :func:`load_into` are the only places that write and read a checkpoint file; the
case checkpointers below and :mod:`ddlcourse.elastic` (a step-numbered checkpoint under torchrun) use them.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from ddlcourse.parallel.data_parallel import unwrap

class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read."""


FRESH_ADVICE = "run again with --fresh (or fresh=True) to start over"


def _why_unreadable(e: Exception, stage: str) -> str:
    """A short reason in the course's words (torch's own advice about weights_only is not for learners)."""
    if stage == "file":
        return "not a readable checkpoint file (truncated, corrupt or not written by this course)"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"it does not fit this model ({first[:160]})"


def atomic_save(obj, path: Path | str) -> Path:
    """``torch.save(obj)`` to ``path`` through ``<path>.tmp`` and ``os.replace``: a crash while writing leaves
    only the ``.tmp`` file, never a truncated checkpoint under the real name. Makes the folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    return path


def load_into(path: Path | str, model, optimizer=None, map_location=None) -> dict:
    """Read the checkpoint ``path`` and restore ``model`` (and ``optimizer``, if given and saved) from it.

    Files hold only tensors and plain values, so they load with ``torch.load(weights_only=True)``, onto
    ``map_location`` (the rank's device). Returns the whole saved dict. A file that cannot be read, or that
    does not fit the model, raises :class:`CheckpointError` naming the file and saying which of the two.
    """
    stage = "file"
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
        stage = "state"
        unwrap(model).load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
    except Exception as e:  # corrupt, truncated or from another model
        raise CheckpointError(f"{path} is unreadable: {_why_unreadable(e, stage)}") from e
    return state


def _epoch_of(path: Path) -> int:
    return int(path.stem.split("-")[1])               # epoch-<epochs done>.pt


class Checkpointer:
    """Per-epoch checkpoints in ``folder``: written atomically by rank 0, the last ``keep`` kept.

    Loads go onto the run's device. If the newest file is unreadable, the previous one is used (with a
    warning): no finished epoch is lost twice. If none is readable, :class:`CheckpointError` names the files
    and says how to start over. On a run's ranks, rank 0 alone lists the folder and chooses; the others load
    the epoch it chose (see :meth:`load`).
    """

    def __init__(self, folder: Path | str, ctx=None, keep: int = 2):   # ctx: the run's RunContext, if any
        self.folder = Path(folder)
        self.ctx = ctx
        self.keep = keep
        self.loaded: Path | None = None               # the file the last load() restored
        if self.writes:
            self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def writes(self) -> bool:
        """Whether this rank writes the files (rank 0; subclasses may name another writer)."""
        return self.ctx is None or self.ctx.is_root

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob("epoch-*.pt"), key=_epoch_of)

    def _path(self, epoch: int) -> Path:
        return self.folder / f"epoch-{epoch:04d}.pt"

    def save(self, epoch: int, model, optimizer=None, **extra) -> None:
        """Save after ``epoch`` epochs are done (call on every rank; rank 0 writes)."""
        if self.writes:
            state = {"epoch": int(epoch), "model": unwrap(model).state_dict(), "extra": extra}
            if optimizer is not None:
                state["optimizer"] = optimizer.state_dict()
            atomic_save(state, self._path(epoch))
            for old in self._files()[:-self.keep]:
                old.unlink(missing_ok=True)
        if self.ctx is not None:
            self.ctx.barrier()

    def load(self, model, optimizer=None) -> tuple[int, dict]:
        """Restore the newest readable checkpoint; returns ``(epochs_done, extra)`` (``(0, {})`` if none).

        Call it on every rank of the run: rank 0 lists the folder, chooses the file and broadcasts its epoch (over
        the run's MPI communicator), and every rank loads that epoch (from its own part's folder when the model
        is split). Ranks that each listed the folder could disagree: on an NFS home a node may be shown a listing
        cached for 30-60 s, its ranks would resume from an older epoch than the others, and the run would hang.
        """
        device = getattr(self.ctx, "device", None) or "cpu"
        comm = self.ctx.comm if self.ctx is not None else None
        state, choice = None, None
        if comm is None or comm.Get_rank() == 0:
            state, choice = self._newest_readable(model, optimizer, device)
        if comm is not None:
            choice = comm.bcast(choice, root=0)                 # NEW: (epoch, error) as rank 0 found them
        epoch, error = choice
        if epoch and state is None:                             # not rank 0: the file rank 0 chose
            try:
                state = load_into(self._path(epoch), model, optimizer, map_location=device)
            except CheckpointError as e:                        # e.g. a part whose writer died before this epoch
                error = str(e)
        if comm is not None:                                    # a rank that cannot load stops every rank, not
            error = next((e for e in comm.allgather(error) if e), "")   # only itself (the others would hang)
        if error:
            raise CheckpointError(error)
        if epoch == 0:
            return 0, {}
        self.loaded = self._path(epoch)
        return int(state["epoch"]), dict(state.get("extra", {}))

    def _newest_readable(self, model, optimizer, device) -> tuple[dict | None, tuple[int, str]]:
        """The state of the newest file that loads into ``model`` (and ``optimizer``), and ``(its epoch, "")``;
        ``(None, (0, ""))`` when there is none, ``(None, (0, why))`` when none of them is readable."""
        errors = []
        files = self._files()
        for i, path in enumerate(reversed(files)):
            try:
                state = load_into(path, model, optimizer, map_location=device)
            except CheckpointError as e:
                errors.append(str(e))
                more = "; trying an older one" if i + 1 < len(files) else ""
                warnings.warn(f"checkpoint {errors[-1]}{more}", stacklevel=3)
                continue
            return state, (_epoch_of(path), "")
        if errors:
            return None, (0, f"no readable checkpoint in {self.folder}: {'; '.join(errors)}. "
                             f"{FRESH_ADVICE[0].upper()}{FRESH_ADVICE[1:]}, or check that the model settings match "
                             "the run that wrote it.")
        return None, (0, "")

    def clear(self) -> None:
        if self.writes:
            for f in self._files():
                f.unlink(missing_ok=True)
        if self.ctx is not None:
            self.ctx.barrier()


class RunCheckpointer(Checkpointer):
    """The checkpointer of a run context (:meth:`RunContext.checkpointer`): says on rank 0 when it resumes."""

    def __init__(self, folder, ctx, keep: int = 2, label: str = "", epochs: int | None = None,
                 writer: bool | None = None):
        self._writer = writer                    # None: rank 0 writes; else whether this rank writes
        super().__init__(folder, ctx, keep)
        self.label, self.epochs = label or self.folder.name, epochs

    @property
    def writes(self) -> bool:
        return super().writes if self._writer is None else self._writer

    def load(self, model, optimizer=None) -> tuple[int, dict]:
        done, extra = super().load(model, optimizer)
        if done and self.writes:
            of = f" of {self.epochs}" if self.epochs is not None else ""
            print(f"resuming {self.label} from epoch {done}{of} ({self.loaded})", flush=True)
            if self.epochs is not None and done >= self.epochs:
                print(f"{self.label}: all {self.epochs} epochs are done already (fresh=True trains again)", flush=True)
        return done, extra
