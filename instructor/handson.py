"""The hands-on blocks of slides/AGENDA.md: the exercises each one names, their minutes, and the measurements those
minutes come from (slides/exercise_minutes.json).

    python -m instructor.handson measure [--scale smoke|laptop|cluster] [NOTEBOOK ...]   # run the notebooks, time them
    python -m instructor.handson minutes      # each block's exercises: lines, writing, run, check, minutes

A block (``### `NAME`: title`` under ``## Hands-on blocks``) follows a deck, runs at one scale and lists its
exercises (build-its and checked questions) in the order of their notebooks, each with its minutes. A plan's row
``| 14:00 | 41 | hands-on | `NAME` ... |`` sets the block in the day, right after its deck. An exercise's minutes in a
block are ``ceil(writing + (run + check) / 60)``:

* **writing** (a model, in minutes): reading the exercise and writing the answer, ``FIXED + PER_LINE * lines``, where
  ``lines`` are the logical lines of the reference (``selfcheck.logical_lines``: of the reference solution for a
  build-it, of the reference answer for a question). The one human measurement calibrates it: a learner who tried
  the six build-its of ``CALIBRATION`` from the notebook text alone understood and solved each in 5 to 15 minutes;
  the model is the line through (the fewest lines of the six, 5 min) and (the most, 15 min);
* **run** (measured, seconds): the wall time of the notebook's cells after the block's previous exercise in that
  notebook (from the top for its first) through the exercise's own cell, run at the block's scale in a fresh kernel;
* **check** (measured, seconds, build-its only): from submitting the reference to its verdict, as
  ``python -m ddlcourse bench-checkers`` times it (the rehearsal, then the real ranks).

``measure`` stores the runs and the checks in slides/exercise_minutes.json with the date, the cores and the load
average; the tests check that every minute in the agenda is the one computed here (:func:`check_blocks`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddlcourse import selfcheck as sc
from ddlcourse.config import SCALES
from instructor import talk

ROOT = talk.ROOT
MINUTES = ROOT / "slides" / "exercise_minutes.json"

CALIBRATION = ("ring_allreduce", "my_ddp", "pipeline_1f1b", "sharded_linear", "ring_attention_forward",
               "halo_exchange")
BAND = (5.0, 15.0)       # minutes: each of the six took a learner between these
MIN_SHARE = {"half": 0.30, "full": 0.40}    # the least share of each plan that is hands-on

_CALL = re.compile(r"""\b(check|check_code|use_checked)\(\s*["']([A-Za-z0-9_]+)["']""")
_BLOCK = re.compile(r"^`(\w+)`:\s*(.+)$")
_AFTER = re.compile(r"After `(\w+)`.*?\b(smoke|laptop|cluster) scale")


# --------------------------------------------------------------------------- where the notebooks ask for exercises
@dataclass
class Entry:
    name: str
    kind: str                # "build-it" (check_code, use_checked) or "question" (check)
    notebook: str            # relative to the repository root
    cell: str                # the id of the cell that checks it
    index: int               # that cell's position in the notebook


def notebook_exercises(path: Path) -> list[Entry]:
    """The exercises a notebook or lab checks, in the order of its cells."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    out, seen = [], set()
    for i, c in enumerate(cells):
        if c["cell_type"] != "code":
            continue
        for call, name in _CALL.findall("".join(c["source"])):
            if name not in seen:
                seen.add(name)
                out.append(Entry(name, "question" if call == "check" else "build-it",
                                 str(path.relative_to(ROOT)), c.get("id", ""), i))
    return out


def exercise_index() -> dict[tuple[str, str], Entry]:
    """``{(name, notebook): Entry}`` over every notebook and lab."""
    paths = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
    return {(e.name, e.notebook): e for p in paths for e in notebook_exercises(p)}


# --------------------------------------------------------------------------- the blocks in AGENDA.md
@dataclass
class Item:
    name: str
    kind: str
    notebook: str
    minutes: int


@dataclass
class Block:
    name: str
    title: str
    deck: str                # the deck it follows
    scale: str
    items: list[Item]
    slow: str                # what to do if the cluster is slow
    debrief: list[str]       # the questions that start the debrief

    @property
    def minutes(self) -> int:
        return sum(i.minutes for i in self.items)


def _paragraph(lines: list[str], label: str) -> str:
    """The text of the paragraph that starts with ``**label**`` (up to the next blank line), label removed."""
    for i, ln in enumerate(lines):
        if ln.startswith(f"**{label}**"):
            end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
            return " ".join(x.strip() for x in lines[i:end])[len(label) + 4:].strip()
    return ""


def parse_blocks(text: str) -> dict[str, Block]:
    """The blocks of the ``## Hands-on blocks`` section, by name."""
    section = re.split(r"^## Hands-on blocks\s*$", text, flags=re.M)
    if len(section) < 2:
        return {}
    section = re.split(r"^## ", section[1], flags=re.M)[0]
    blocks = {}
    for chunk in re.split(r"^### ", section, flags=re.M)[1:]:
        heading, *lines = chunk.split("\n")
        m, after = _BLOCK.match(heading.strip()), _AFTER.search(" ".join(lines))
        if not m:
            raise ValueError(f"AGENDA.md: a block's heading is '### `name`: title', got {heading!r}")
        if not after:
            raise ValueError(f"AGENDA.md: block {m.group(1)} needs a line 'After `deck`, at S scale'")
        items = [Item(r[0].strip("`"), r[1], r[2], int(r[3])) for r in talk._table_rows(lines)]
        debrief = []                     # numbered items, each with its indented continuation lines
        for ln in lines:
            if re.match(r"^\d+\.\s", ln):
                debrief.append(re.sub(r"^\d+\.\s*", "", ln).strip())
            elif debrief and ln.startswith("   ") and ln.strip():
                debrief[-1] += " " + ln.strip()
        blocks[m.group(1)] = Block(m.group(1), m.group(2), after.group(1), after.group(2), items,
                                   _paragraph(lines, "If the cluster is slow:"), debrief)
    return blocks


def block_of(row: talk.Row) -> str | None:
    """The block a plan's hands-on row sets: the name in backticks at its start."""
    m = re.match(r"\s*`(\w+)`", row.what)
    return m.group(1) if row.kind == "hands-on" and m else None


# --------------------------------------------------------------------------- the minutes
def reference_of(entry: Entry):
    """The reference a learner's answer is checked against: the solution of a build-it, the answer of a question."""
    if entry.kind == "build-it":
        return sc._code_exercise(entry.name).solution
    sc._load_for(entry.name)
    return sc.EXERCISES[entry.name][0]


def writing_model() -> tuple[float, float]:
    """``(FIXED, PER_LINE)``: minutes to read and write an exercise whose reference has ``lines`` logical lines are
    ``FIXED + PER_LINE * lines``; the line through the calibration's shortest and longest build-its at BAND."""
    lines = [sc.logical_lines(sc._code_exercise(n).solution) for n in CALIBRATION]
    per_line = (BAND[1] - BAND[0]) / (max(lines) - min(lines))
    return BAND[0] - per_line * min(lines), per_line


def load_measurements(path: Path = MINUTES) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"runs": {}, "checks": {}}


def through_seconds(data: dict, notebook: str, cell: str, scale: str) -> float:
    """Measured seconds of a notebook's cells from the top through cell ``cell``, at ``scale``."""
    run = data["runs"].get(scale, {}).get(notebook)
    if run is None:
        raise KeyError(f"{notebook} was not measured at the {scale} scale: python -m instructor.handson measure "
                       f"--scale {scale} {notebook}")
    ids = [cid for cid, _ in run["cells"]]
    if cell not in ids:
        raise KeyError(f"{notebook} was measured before its cell {cell} existed: measure it again")
    return sum(s for _, s in run["cells"][:ids.index(cell) + 1])


def check_seconds(data: dict, name: str) -> float:
    """Measured seconds from submitting build-it ``name``'s reference to its verdict."""
    if name not in data["checks"]:
        raise KeyError(f"the check of {name} was not measured: python -m instructor.handson measure")
    return data["checks"][name]["seconds"]


@dataclass
class Figure:
    entry: Entry
    lines: int
    writing: float           # minutes, modelled
    run_s: float             # seconds, measured
    check_s: float           # seconds, measured

    @property
    def minutes(self) -> int:
        return math.ceil(round(self.writing + (self.run_s + self.check_s) / 60, 6))


def figures(block: Block, data: dict, index: dict, scale: str | None = None) -> list[Figure]:
    """Each exercise of ``block`` with its modelled and measured parts, at ``scale`` (default: the block's).
    KeyError when an exercise or a measurement is missing."""
    scale = scale or block.scale
    fixed, per_line = writing_model()
    done: dict[str, float] = {}          # notebook -> seconds through the block's previous exercise in it
    out = []
    for it in block.items:
        entry = index[(it.name, it.notebook)]
        lines = sc.logical_lines(reference_of(entry))
        through = through_seconds(data, entry.notebook, entry.cell, scale)
        check = check_seconds(data, it.name) if entry.kind == "build-it" else 0.0
        out.append(Figure(entry, lines, fixed + per_line * lines, through - done.get(entry.notebook, 0.0), check))
        done[entry.notebook] = through
    return out


def check_blocks(text: str, data: dict, decks: list[talk.Deck], index: dict | None = None) -> list[str]:
    """Every rule of the hands-on blocks the agenda breaks: each exercise exists in the notebook named and is of the
    kind named, a block lists them in the order of their notebooks, each minute is the computed one (measured run and
    check, modelled writing), each plan's hands-on row follows its block's deck and has the block's minutes, every
    block is in a plan and has its debrief questions and what to do if the cluster is slow, each plan is hands-on
    for at least its MIN_SHARE (and its text, "Hands-on: N of M minutes", says how much), and the full day runs a
    lab."""
    index = exercise_index() if index is None else index
    plans, _ = talk.parse_agenda(text)
    blocks = parse_blocks(text)
    out = []
    for b in blocks.values():
        where = f"block {b.name}"
        if b.deck not in {d.name for d in decks}:
            out.append(f"{where}: follows no deck {b.deck} in slides/talk")
        if not b.items:
            out.append(f"{where}: names no exercise")
        if len(b.debrief) < 2 or not b.slow:
            out.append(f"{where}: needs two or more debrief questions and 'If the cluster is slow:'")
        known = True
        for it in b.items:
            e = index.get((it.name, it.notebook))
            if e is None:
                there = sorted(nb for n, nb in index if n == it.name)
                out.append(f"{where}: no exercise {it.name} in {it.notebook}" + (f" (it is in {there})" if there else ""))
                known = False
            elif e.kind != it.kind:
                out.append(f"{where}: {it.name} is a {e.kind}, not a {it.kind}")
        if not known:
            continue
        positions = [(it.notebook, index[(it.name, it.notebook)].index) for it in b.items]
        if positions != sorted(positions):
            out.append(f"{where}: the exercises are not in the order of their notebooks")
            continue
        try:
            for it, f in zip(b.items, figures(b, data, index)):
                if it.minutes != f.minutes:
                    out.append(f"{where}: {it.name} has {it.minutes} min, the measurement and the model give "
                               f"{f.minutes} ({f.writing:.1f} min writing, {f.run_s:.0f} s run, {f.check_s:.0f} s check)")
        except KeyError as e:
            out.append(f"{where}: {e.args[0]}")
    placed = set()
    for p in plans.values():
        hands_on = 0
        for before, row in zip([None] + p.rows, p.rows):
            name = block_of(row)
            if row.kind != "hands-on":
                continue
            hands_on += row.minutes
            if name not in blocks:
                out.append(f"{p.heading}: the hands-on row {row.what!r} names no block of '## Hands-on blocks'")
                continue
            placed.add(name)
            b = blocks[name]
            if row.minutes != b.minutes:
                out.append(f"{p.heading}: block {name} has {row.minutes} min here, its exercises add up to {b.minutes}")
            if before is None or before.deck != b.deck:
                out.append(f"{p.heading}: block {name} must come right after its deck {b.deck}")
        if p.key in MIN_SHARE and hands_on < MIN_SHARE[p.key] * p.length:
            out.append(f"{p.heading}: {hands_on} of {p.length} min hands-on ({hands_on / p.length:.0%}), "
                       f"at least {MIN_SHARE[p.key]:.0%} wanted")
        said = re.search(rf"^## {re.escape(p.heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
        said = re.search(r"Hands-on: (\d+) of (\d+) minutes", said.group(1) if said else "")
        if said and (int(said.group(1)), int(said.group(2))) != (hands_on, p.length):
            out.append(f"{p.heading}: its text says {said.group(0)}, its rows {hands_on} of {p.length}")
    for name in sorted(set(blocks) - placed):
        out.append(f"block {name} is in no plan")
    if "full" in plans and not any(it.notebook.startswith("labs/") for r in plans["full"].rows
                                   if block_of(r) in blocks for it in blocks[block_of(r)].items):
        out.append("the full day runs no lab in a hands-on block")
    return out


# --------------------------------------------------------------------------- measuring
def time_cells(path: Path, scale: str, timeout: int = 1800) -> list[list]:
    """``[[cell id, seconds], ...]``: every cell of the notebook at ``path`` run in order in a fresh kernel at
    ``scale`` (figures inline, as in JupyterLab), each timed from its start to its end."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, DDLCOURSE_SCALE=scale, MPLBACKEND="module://matplotlib_inline.backend_inline",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.reset_execution_trackers()
    out = []
    with client.setup_kernel(env=env):
        for i, cell in enumerate(nb.cells):
            t0 = time.perf_counter()
            client.execute_cell(cell, i)
            out.append([cell.get("id", ""), round(time.perf_counter() - t0, 2)])
    return out


def _stamp() -> dict:
    return {"measured": datetime.date.today().isoformat(), "cores": os.cpu_count(),
            "load": round(os.getloadavg()[0], 2)}


def measure(notebooks: list[str], scale: str, checks: list[str], path: Path = MINUTES, log=print) -> dict:
    """Run ``notebooks`` at ``scale`` and time their cells, time the check of the build-its ``checks``, and merge
    both into the file at ``path``."""
    from ddlcourse.tools import bench_checkers

    data = load_measurements(path)
    for nb in notebooks:
        stamp = _stamp()
        t0 = time.perf_counter()
        data["runs"].setdefault(scale, {})[nb] = {**stamp, "cells": time_cells(ROOT / nb, scale)}
        log(f"{nb} at the {scale} scale: {time.perf_counter() - t0:.0f} s (load {stamp['load']} at the start)")
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    if checks:
        stamp = _stamp()
        for name, row in bench_checkers.measure(checks, repeat=1, progress=log).items():
            if not row["reference"]["right"]:
                raise RuntimeError(f"the reference of {name} did not pass its check")
            data["checks"][name] = {**stamp, "seconds": round(row["reference"]["seconds"], 2)}
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return data


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instructor.handson",
                                description="Measure the exercises of the agenda's hands-on blocks, or show their minutes.")
    p.add_argument("action", choices=["measure", "minutes"])
    p.add_argument("notebooks", nargs="*", help="measure only these, at --scale (default: every notebook a block "
                   "names, and the check of every build-it a block names)")
    p.add_argument("--scale", choices=SCALES, default=None,
                   help="measure at this scale (default: each block's own scale, and smoke)")
    a = p.parse_intermixed_args(argv)
    text = talk.AGENDA.read_text(encoding="utf-8")
    blocks = parse_blocks(text)
    if a.action == "minutes":
        data, index = load_measurements(), exercise_index()
        for b in blocks.values():
            print(f"{b.name} (after {b.deck}, {b.scale} scale): {b.minutes} min in the agenda")
            for it, f in zip(b.items, figures(b, data, index)):
                print(f"  {it.name:<28} {it.kind:<9} {f.lines:>3} lines  writing {f.writing:4.1f} min  run {f.run_s:5.1f} s"
                      f"  check {f.check_s:4.1f} s  -> {f.minutes:>2} min (agenda: {it.minutes})")
        return 0
    if a.notebooks:
        measure(a.notebooks, a.scale or "smoke", [])
        return 0
    wanted: dict[str, set] = {}
    for b in blocks.values():
        for s in ([a.scale] if a.scale else sorted({b.scale, "smoke"})):
            wanted.setdefault(s, set()).update(it.notebook for it in b.items)
    checks = sorted({it.name for b in blocks.values() for it in b.items if it.kind == "build-it"})
    for i, (scale, nbs) in enumerate(sorted(wanted.items())):
        measure(sorted(nbs), scale, checks if i == 0 else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
