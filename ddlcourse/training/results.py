"""Where a run's files go (``results/<case>/``) and how its results become JSON."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import torch


def repo_root() -> Path | None:
    """The course checkout (the folder with pyproject.toml above the ``ddlcourse`` package), if any."""
    here = Path(__file__).resolve().parents[2]           # ddlcourse/training/results.py -> the checkout
    return here if (here / "pyproject.toml").exists() else None


def results_dir(case: str) -> Path:
    """``results/<case>/`` in the checkout (ignored by git), or under ``$DDLCOURSE_RESULTS``."""
    base = os.environ.get("DDLCOURSE_RESULTS")
    root = Path(base) if base else (repo_root() or Path.cwd()) / "results"
    d = root / case
    d.mkdir(parents=True, exist_ok=True)
    return d


def run_dir(name: str) -> Path:
    """A new, empty folder for one run under ``results/<name>/``: checkpoints and files that ranks on other
    nodes read. It is on the shared file system the checkout is on, never a node-local ``/tmp`` (a rank on
    another node would find nothing there)."""
    parent = results_dir(name)
    for i in range(1000):
        d = parent / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{i}"
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"could not make a new run folder under {parent}")


def write_text_atomic(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``: a reader (a notebook following
    a progress file, a later run reading a result) sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def summary(result: dict) -> dict:
    """The plain values of a result (numbers, text, small dicts of them): for printing and result files."""
    out = {}
    for k, v in result.items():
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, (np.integer, np.floating)):
            out[k] = v.item()
        elif isinstance(v, dict):
            sub = summary(v)
            if sub:
                out[k] = sub
    return out


def _json_default(o):
    if torch.is_tensor(o):
        return o.detach().cpu().tolist()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    if isinstance(o, (Path, torch.device)):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def to_json(obj) -> str:
    """JSON of a result: tensors (moved to the CPU), NumPy arrays and scalars become lists and numbers."""
    return json.dumps(obj, indent=1, default=_json_default)
