"""The course's one command line:  python -m ddlcourse <command> [arguments]

Every tool of the course is a command here (``python -m ddlcourse --help`` lists them, ``python -m ddlcourse
COMMAND --help`` explains one). Commands that run on ranks start under ``mpiexec -n N`` or ``srun``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ddlcourse import versions

# name -> (one line of help, where it lives: a function here, or "module:function" taking argv, and the words
# put before the user's argv). Each command imports its module only when it runs: `plan` alone pulls in
# torch.distributed.pipelining and every model of the course, about 2.5 CPU-s that every other command would
# pay, on each rank of `check` and `run`.
COMMANDS: dict[str, tuple[str, object, tuple]] = {}
GROUPS = (
    ("the course", ("info", "check", "run", "check-exercise")),
    ("clusters and sites", ("clusters", "plan", "srun-mpi", "engines", "build", "device-use")),
    ("measurements", ("synthetic-bench", "bench-ddp", "profile", "bench-simp", "bench-checkers")),
)


def command(name: str, help_: str, target="", before: tuple = ()):
    """Register a command: ``target`` is ``"module:function"`` (called with the argv), or, as a decorator, the
    function below (called with the argv too)."""
    def deco(fn):
        COMMANDS[name] = (help_, fn, before)
        return fn
    if target:
        COMMANDS[name] = (help_, target, before)
        return None
    return deco


def _parser(name: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"python -m ddlcourse {name}", description=description)


@command("info", "versions of everything the course runs on")
def _cmd_info(argv) -> int:
    _parser("info", "Versions of everything the course runs on.").parse_args(argv)
    for k, v in versions().items():
        print(f"{k:<12} {v if v is not None else 'MISSING'}")
    return 0


@command("check", "allreduce three ways (mpi4py, torch.distributed, Horovod) on every rank; --ids: where each runs")
def _cmd_check(argv) -> int:
    c = _parser("check", "The allreduce three ways, and with CPU and CUDA tensors, on every rank; run it under "
                "mpiexec -n 2 (or srun). --ids: only where each rank runs.")
    c.add_argument("--length", type=int, default=4)
    c.add_argument("--ids", action="store_true", help="only show and check where each rank runs (host, local rank, GPU)")
    c.add_argument("--expect-ranks", type=int, default=None, help="fail unless the MPI world has this many ranks")
    c.add_argument("--require-cuda", action="store_true", help="fail when a rank has no GPU (a GPU allocation)")
    args = c.parse_args(argv)
    from mpi4py import MPI      # lazy: importing it starts MPI, which only this command needs

    from ddlcourse import checks, dist

    comm = MPI.COMM_WORLD
    if args.expect_ranks is not None and comm.Get_size() != args.expect_ranks and not args.ids:
        if comm.Get_rank() == 0:  # singletons: every process is rank 0 of 1, and says so once
            print(f"check: FAIL: {args.expect_ranks} rank(s) expected, the MPI world has {comm.Get_size()} "
                  "(srun: DDLCOURSE_SRUN_MPI must name the plugin of the MPI mpi4py uses)")
        return 1
    if args.ids:  # where each rank runs; starts neither torch.distributed nor Horovod
        rows = comm.gather(checks.placement(), root=0)
        ok = True
        if comm.Get_rank() == 0:
            for line in checks.format_placement(rows):
                print(line)
            problems = checks.placement_problems(rows, args.expect_ranks, require_gpu=args.require_cuda)
            ok = not problems
            gpus = "one GPU per rank" if all(r["gpu"] for r in rows) else "CPU ranks"
            print("placement: " + ("FAIL: " + "; ".join(problems) if problems else
                  f"OK: {len(rows)} rank(s) on {len({r['host'] for r in rows})} host(s), local ranks 0..k-1 "
                  f"on each host, {gpus}"))
        return 0 if comm.bcast(ok, root=0) else 1
    res = checks.allreduce_three_ways(args.length)
    res["tf32"] = checks.tf32_state() if res["device"].startswith("cuda") else None
    allres = comm.gather(res, root=0)
    ok = True
    if dist.rank() == 0:
        n = dist.world_size()
        for r in allres:
            print(f"rank {r['rank']}: mpi4py={r['mpi4py']} torch.distributed={r['torch.distributed']} horovod={r['horovod']}")
        for r in allres:
            for d in r["devices"]:
                shown = {"ok": f"{d['value']} ok", "wrong": f"{d['value']} WRONG", "error": f"ERROR: {d['detail']}",
                         "skipped": d["detail"]}[d["status"]]
                print(f"rank {r['rank']} ({r['device']}): {d['name']}: {shown}")
            if r["tf32"] is not None:
                print(f"rank {r['rank']} ({r['device']}): TF32 allowed: matmul {r['tf32']['matmul']}, "
                      f"cudnn {r['tf32']['cudnn']}")
        three = checks.agree([{k: r[k] for k in ("mpi4py", "torch.distributed", "horovod")} for r in allres],
                             n, args.length)
        print(f"all three agree with the expected sum {checks.expected_sum(n, args.length)}: {three}")
        statuses = {d["status"] for r in allres for d in r["devices"]}
        dev_ok = not statuses & ({"wrong", "error"} | ({"skipped"} if args.require_cuda else set()))
        ok = three and dev_ok   # = checks.agree(allres, n, args.length, require_cuda=args.require_cuda)
        if args.require_cuda and "skipped" in statuses:
            cpu = sorted({r["rank"] for r in allres for d in r["devices"] if d["status"] == "skipped"})
            print(f"check: FAIL: --require-cuda, but the CUDA allreduces were skipped (no CUDA on rank(s) {cpu})")
        note = " (CUDA allreduces skipped: no CUDA)" if "skipped" in statuses else ""
        print(f"device allreduces (CPU tensor through the default group, CUDA tensors through torch.distributed "
              f"and Horovod): {'ok' if dev_ok else 'FAIL'}{note}")
    ok = comm.bcast(ok, root=0)
    dist.shutdown()
    return 0 if ok else 1


@command("clusters", "course clusters recorded as running (list), or stop them all (stop-all [--orphans])")
def _cmd_clusters(argv) -> int:
    cl = _parser("clusters", "Course clusters recorded as running; stop them all.")
    cl.add_argument("action", choices=["list", "stop-all"])
    cl.add_argument("--orphans", action="store_true", help="only clusters whose starting process is gone")
    args = cl.parse_args(argv)
    from ddlcourse.cluster import processes
    if args.action == "list":
        rows = processes.recorded_clusters()
        for f, st in rows:
            alive = st.get("parent_pid") and processes.alive(st["parent_pid"])
            print(f"{st.get('cluster_id', f.name)}  n={st.get('n')}  started by pid {st.get('parent_pid')}"
                  f" ({'alive' if alive else 'gone'})")
        if not rows:
            print("no course clusters recorded in", processes.runtime_dir())
    else:
        n = processes.stop_all(only_orphans=args.orphans)
        print(f"stopped {n} cluster(s)")
    return 0


@command("plan", "memory (per GPU and node) and disk of every notebook and lab at a scale; exit 1 if one does not fit")
def _cmd_plan(argv) -> int:
    pl = _parser("plan", "Memory budget per GPU and per node of every notebook and lab at a scale profile.")
    pl.add_argument("--scale", default="cluster", help="smoke | laptop | cluster (default: cluster)")
    pl.add_argument("--measure", action="store_true",
                    help="on a GPU: run each workload once and compare the allocator's peak with the estimate")
    args = pl.parse_args(argv)
    from ddlcourse.tools import plan
    return plan.main_measure(args.scale) if args.measure else plan.main(args.scale)


command("run", "train a case study under mpiexec or srun (run CASE --help: its settings)",
        "ddlcourse.training.cli:main")
command("check-exercise", "check your solution of an exercise, written in a file (check-exercise NAME FILE)",
        "ddlcourse.exercises.terminal:main")
command("srun-mpi", "the srun --mpi plugin for the MPI mpi4py was built with (--explain: why)",
        "ddlcourse.checks:main", ("srun-mpi",))
command("engines", "engines the notebooks start at a scale; warns when an allocation is too small",
        "ddlcourse.checks:main", ("engines",))
command("build", "torch / CUDA / NCCL / Horovod build on this host (--require-gpu)", "ddlcourse.checks:main", ("build",))
command("device-use", "run `python -m ddlcourse ARGS...`, then print each rank's peak CUDA memory",
        "ddlcourse.checks:main", ("device-use",))
command("synthetic-bench", "images/s of a synthetic benchmark per rank and in all (notebook 13; under mpiexec)",
        "ddlcourse.synthetic_bench:main")
command("bench-ddp", "DDP (gloo), DDP with the MPI hook and Horovod timed side by side (under mpiexec, 2+ ranks)",
        "ddlcourse.tools.bench_ddp:main")
command("profile", "profile a DDP step on every rank (profile step), or write a Horovod timeline (notebook 24)",
        "ddlcourse.profiling:main")
command("bench-simp", "the topology solver's two linear solvers timed on one 3-D problem (lab 3)",
        "ddlcourse.tools.bench_simp:main")
command("bench-checkers", "seconds from submission to verdict for every build-it exercise (right, wrong, "
        "deadlocked, one rank raising)", "ddlcourse.tools.bench_checkers:main")


def usage() -> str:
    lines = [__doc__.strip(), ""]
    width = max(map(len, COMMANDS))
    for title, names in GROUPS:
        lines.append(f"{title}:")
        lines += [f"  {n:<{width}}  {COMMANDS[n][0]}" for n in names]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"python -m ddlcourse: error: unknown command {name!r}; the commands are: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    _, target, before = COMMANDS[name]
    if isinstance(target, str):
        module, func = target.split(":")
        target = getattr(importlib.import_module(module), func)
    try:
        return target([*before, *rest])
    except (ValueError, FileNotFoundError) as e:  # bad input: a clear message, not a traceback
        print(f"python -m ddlcourse {name}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
