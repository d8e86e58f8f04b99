"""How long an MPICluster takes to start and stop, phase by phase (issue 30: a 2-engine cluster in 4 s).

    .venv/bin/python env/bench_cluster.py [--n 2] [--reps 5] [--heartbeat-ms 3000 1000]
    .venv/bin/python env/bench_cluster.py --engine ipyparallel.engine ddlcourse.cluster.engine   # torch preloaded or not
    .venv/bin/python env/bench_cluster.py --engines-start with after   # engines launched with the controller or after
    .venv/bin/python env/bench_cluster.py --engine-fork on cold off   # engines forked from this process's server
                                             # (started by the first start), from a new one each start, or fresh
    .venv/bin/python env/bench_cluster.py --nanny forked fresh   # each engine's nanny forked too, or a fresh python
    .venv/bin/python env/bench_cluster.py --engine-fork cold --preload dynamo plain   # the server imports
                                             # torch._dynamo (a rank's first backward imports it) or not

Prints each repetition's phases, then the median and min-max of each, and the machine's load. A benchmark,
not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

from ddlcourse.cluster import forkserver, mpicluster as cluster   # the module itself: its settings are set per run

PRELOAD = cluster.ENGINE_PRELOAD


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--heartbeat-ms", type=int, nargs="*", default=[cluster.HEARTBEAT_MS],
                    help="the hub's heartbeat period(s); several are interleaved, repetition by repetition")
    ap.add_argument("--engine", nargs="*", default=[cluster.ENGINE_MODULE],
                    help="the engines' program(s), a module run with python -m: ddlcourse.cluster.engine (torch imported "
                         "while the engine registers) or ipyparallel.engine (no preload); several are interleaved")
    ap.add_argument("--engines-start", nargs="*", choices=["with", "after"],
                    default=["with" if cluster.ENGINES_WITH_CONTROLLER else "after"],
                    help="on one host, launch the engines with the controller (they read its connection file when "
                         "it comes) or after it is up (ipyparallel's default); several are interleaved")
    ap.add_argument("--engine-fork", nargs="*", choices=["on", "cold", "off"],
                    default=["on" if cluster.ENGINE_FORK else "off"],
                    help="on one host, fork the engines from the server that this process's first start started "
                         "(on), from a server started anew for each start (cold: what a notebook's first cluster "
                         "pays), or start each engine fresh (off); several are interleaved")
    ap.add_argument("--nanny", nargs="*", choices=["forked", "fresh"],
                    default=["forked" if cluster.NANNY_FORK else "fresh"],
                    help="with forked engines, fork each one's nanny from the same server, or start it as a fresh "
                         "python as ipyparallel does; several are interleaved")
    ap.add_argument("--preload", nargs="*", choices=["dynamo", "plain"],
                    default=["dynamo" if "torch._dynamo" in cluster.ENGINE_PRELOAD else "plain"],
                    help="the fork server imports torch._dynamo too (what each engine's first backward pass would "
                         "import), or only torch; several are interleaved (use with --engine-fork cold)")
    a = ap.parse_args()
    for hb in a.heartbeat_ms:
        if hb <= 0:
            ap.error(f"--heartbeat-ms must be positive, got {hb}")
    variants = list(itertools.product(a.heartbeat_ms, a.engine, a.engines_start, a.engine_fork, a.nanny, a.preload))
    runs = {v: [] for v in variants}
    for i in range(a.reps):
        for v in variants:
            hb, engine, when, fork, nanny, preload = v
            runs[v].append(_one(a.n, hb, engine, when == "with", fork, nanny == "forked", preload == "dynamo"))
            print(f"rep {i + 1}, heartbeat {hb} ms, {engine}, launched {when} the controller, fork {fork}, nanny "
                  f"{nanny}, preload {preload}: " + ", ".join(f"{k} {x:.2f}" for k, x in runs[v][-1].items()),
                  flush=True)
    print(f"\n{a.n} engines, {a.reps} repetitions, load average {os.getloadavg()[0]:.2f} (1 min)")
    for (hb, engine, when, fork, nanny, preload), rows in runs.items():
        print(f"heartbeat {hb} ms, engines {engine}, launched {when} the controller, fork {fork}, nanny {nanny}, "
              f"preload {preload}:")
        for k in rows[0]:
            v = [r[k] for r in rows]
            print(f"  {k:20s} median {statistics.median(v):6.2f} s   min {min(v):6.2f}   max {max(v):6.2f}")
    # what an engine's exit costs (the stop waits for it): the exit-time collection, skipped by ddlcourse's gc.freeze
    for imports in ("torch", "torch, ddlcourse"):
        v = _exit_seconds(imports, a.reps)
        print(f"a process that imported {imports}: exits in median {statistics.median(v):.2f} s "
              f"(min {min(v):.2f}, max {max(v):.2f})")


def _exit_seconds(imports: str, reps: int) -> list[float]:
    """Seconds from a child Python's last statement to its exit, after ``import <imports>``."""
    code = f"import {imports}; import sys, time; sys.stdout.write(repr(time.perf_counter())); sys.stdout.flush()"
    out = []
    for _ in range(reps):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        out.append(time.perf_counter() - float(p.stdout))   # perf_counter: one monotonic clock for both
    return out


def _train_step() -> float:
    """One SGD step of a small model: a rank's first backward pass imports torch._dynamo unless it has it."""
    import torch
    model = torch.nn.Linear(8, 2)
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return float(loss)


def _one(n: int, heartbeat_ms: int, engine: str, with_controller: bool, fork: str, fork_nanny: bool,
         dynamo: bool) -> dict:
    cluster.HEARTBEAT_MS, cluster.ENGINE_MODULE = heartbeat_ms, engine
    cluster.ENGINES_WITH_CONTROLLER, cluster.ENGINE_FORK = with_controller, fork != "off"
    cluster.NANNY_FORK = fork_nanny
    cluster.ENGINE_PRELOAD = tuple(m for m in PRELOAD if dynamo or m != "torch._dynamo")
    if fork == "cold":
        forkserver.stop_shared()
    c = cluster.MPICluster(n=n, quiet=True)
    c.start()
    t0 = time.perf_counter()
    c.run(cluster._describe_engine)              # the first call after start
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    c.run(_train_step)
    step = time.perf_counter() - t0
    c.stop()
    return dict(c.start_phases, start=c.start_seconds, **{"first run": first, "first training step": step,
                                                          "start + first step": c.start_seconds + first + step},
                **{f"stop: {k}": v for k, v in c.stop_phases.items()}, stop=c.stop_seconds)


if __name__ == "__main__":
    main()
