"""How long a learner waits for a verdict: every build-it exercise's checker timed on what a learner submits.

    python -m ddlcourse bench-checkers [--repeat 3] [--only NAME,NAME] [--json FILE] [--plot FILE]

For each coding exercise with a reference, the median over ``--repeat`` runs of the seconds from submitting to
the printed verdict, as a notebook gets it (``selfcheck.check_code``; a distributed one on a cluster of 2
engines, 4 where the exercise needs them, started once):

* ``reference``: the right answer (rehearsal, then the real ranks);
* ``mistake``: the exercise's first registered typical mistake;
* ``deadlock`` and ``exception``: the planted deadlock and one-rank exception of
  :mod:`ddlcourse.exercises.wrong` (distributed exercises only).

Each verdict is also checked (the reference passes, the rest do not); a wrong one is marked ``!`` in the table.
The figures depend on the machine and its load: the table starts with the load average and the core count.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time

from ddlcourse import cluster as clusters_
from ddlcourse import selfcheck as sc
from ddlcourse.exercises import wrong

COLUMNS = ("reference", "mistake", "deadlock", "exception")


def _submissions(name: str) -> dict:
    """column -> (the submission, whether the check must pass)."""
    ex = sc._code_exercise(name)
    out = {"reference": (ex.solution, True)}
    if ex.mistakes:
        out["mistake"] = (ex.mistakes[0][0], False)
    if ex.distributed:
        out["deadlock"] = (wrong.planted(name, "deadlock"), False)
        out["exception"] = (wrong.planted(name, "raises"), False)
    return out


def _ranks(ex) -> int:
    return 2 if 2 in ex.ranks else max(ex.ranks)


def measure(names: list[str], repeat: int = 3, progress=print) -> dict:
    """``{name: {column: {"seconds": median, "runs": [...], "right": bool}}}`` for the exercises ``names``."""
    results: dict = {}
    with contextlib.ExitStack() as stack:
        made: dict = {}

        def cluster(n: int):
            if n not in made:
                progress(f"  starting a cluster of {n} engines ...")
                made[n] = stack.enter_context(clusters_.MPICluster(n=n, quiet=True))
            return made[n]

        for i, name in enumerate(names, 1):
            ex = sc._code_exercise(name)
            c = cluster(_ranks(ex)) if ex.distributed else None
            row = {}
            for column, (fn, must_pass) in _submissions(name).items():
                runs, right = [], True
                for _ in range(repeat):
                    said = io.StringIO()
                    t0 = time.perf_counter()
                    with contextlib.redirect_stdout(said):
                        ok = sc.check_code(name, fn, cluster=c)
                    runs.append(time.perf_counter() - t0)
                    right = right and ok == must_pass
                row[column] = {"seconds": statistics.median(runs), "runs": runs, "right": right}
            results[name] = row
            cells = "  ".join(f"{k} {v['seconds']:.1f} s{'' if v['right'] else ' !'}" for k, v in row.items())
            progress(f"[{i}/{len(names)}] {name}: {cells}")
    return results


def table(results: dict) -> str:
    width = max(map(len, results)) if results else 8
    lines = [f"{'exercise':<{width}}  " + "  ".join(f"{c:>10}" for c in COLUMNS)]
    for name, row in results.items():
        cells = []
        for c in COLUMNS:
            v = row.get(c)
            cells.append(f"{'-':>10}" if v is None else f"{v['seconds']:>9.2f}{' ' if v['right'] else '!'}")
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    every = [v["seconds"] for row in results.values() for v in row.values()]
    if every:
        slowest = max(((n, c, v["seconds"]) for n, row in results.items() for c, v in row.items()),
                      key=lambda x: x[2])
        lines.append(f"{len(every)} verdicts: median {statistics.median(every):.2f} s, slowest {slowest[2]:.2f} s "
                     f"({slowest[0]}, {slowest[1]}); {sum(s < 10 for s in every)} of {len(every)} under 10 s")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(names) + 1.5))
    h = 0.8 / len(COLUMNS)
    for j, c in enumerate(COLUMNS):
        ys = [i + j * h for i, n in enumerate(names) if c in results[n]]
        xs = [results[n][c]["seconds"] for n in names if c in results[n]]
        ax.barh(ys, xs, height=h, label=c)
    ax.axvline(10, color="#c44e52", lw=1, ls="--", label="10 s")
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(names))], names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the verdict (median)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse bench-checkers",
                                description="Seconds from submission to verdict for every build-it exercise.")
    p.add_argument("--repeat", type=int, default=3, help="runs per submission; the table shows the median")
    p.add_argument("--only", default="", help="comma-separated exercise names (default: every build-it exercise)")
    p.add_argument("--json", default="", help="write the runs to this file as well")
    p.add_argument("--plot", default="", help="draw the medians into this image file as well")
    args = p.parse_args(argv)
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
    sc._load_all()
    known = sorted(n for n, ex in sc.CODE_EXERCISES.items() if ex.solution is not None and not n.startswith("_"))
    names = [n for n in args.only.split(",") if n] or known
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"no build-it exercise named {', '.join(unknown)}; they are: {', '.join(known)}")
    load = os.getloadavg()[0]
    print(f"bench-checkers: {len(names)} exercises, median of {args.repeat}; load average {load:.2f} on "
          f"{os.cpu_count()} cores at the start", flush=True)
    results = measure(names, args.repeat, progress=lambda s: print(s, flush=True))
    print()
    print(table(results))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
        print(f"figure: {args.plot}")
    return 0 if all(v["right"] for row in results.values() for v in row.values()) else 1
