"""Execute course notebooks and store them the way the repo keeps them.

    .venv/bin/python env/nbexec.py notebooks/00_setup_check.ipynb [...] [--scale smoke] [--keep-all]

Runs each notebook top to bottom in a fresh kernel (at the smoke scale by default), fails on the
first error, then keeps the outputs of the checked cells (``# NBVAL_CHECK_OUTPUT``) only: those are
what nbval compares; every other output is regenerated when a learner runs the notebook. The run
time of each notebook is printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

MARK = "# NBVAL_CHECK_OUTPUT"


def execute(path: str, scale: str, keep_all: bool, timeout: int, run: bool = True) -> float:
    nb = nbformat.read(path, as_version=4)
    os.environ["DDLCOURSE_SCALE"] = scale
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"   # figures become outputs
    t0 = time.perf_counter()
    if run:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}}).execute()
    dt = time.perf_counter() - t0
    nb.metadata.pop("widgets", None)        # widget state of progress bars: not worth keeping
    checked = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        if MARK in cell.source:
            checked += 1
            for out in cell.outputs:
                if out.get("output_type") == "error":
                    raise RuntimeError(f"{path}: checked cell raised")
        elif not keep_all:
            cell.outputs = []
            cell.execution_count = None
    if checked == 0:
        raise RuntimeError(f"{path}: no '{MARK}' cell; every notebook states its key result in one")
    nbformat.write(nb, path)
    return dt


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--scale", default="smoke")
    p.add_argument("--keep-all", action="store_true", help="keep every output (for a look, not for commits)")
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--strip-only", action="store_true", help="do not run: only drop the unchecked outputs")
    a = p.parse_args()
    for nb in a.notebooks:
        dt = execute(nb, a.scale, a.keep_all, a.timeout, run=not a.strip_only)
        print(f"{nb}: {dt:.1f} s at scale {a.scale}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
