"""Command line of the course:  python -m ddlcourse <command>

  info                         versions of everything the course runs on
  check [--ids] [--require-cuda] [--expect-ranks N]
                               allreduce three ways, and with CPU and CUDA tensors; --ids: where each rank
                               runs (run it under: mpiexec -n 2 python -m ddlcourse check)
  clusters list|stop-all       course clusters recorded as running; stop them all
  run CASE [--scale S] [--backend B] [--fresh] [key=value ...]
                               train a case study (run under mpiexec -n N or srun); run CASE --help
                               lists its settings with their values at --scale
  plan [--scale S] [--measure] memory budget of every notebook and lab at a scale profile (per GPU and
                               per node); exit status 1 when something does not fit
"""
from __future__ import annotations

import argparse
import sys

from ddlcourse import versions

# Each command imports its own module, when it runs: `plan` alone pulls in torch.distributed.pipelining and
# every model of the course, about 2.5 CPU-s that every other command would pay, on each rank of `check` and `run`.


def _cmd_info(args) -> int:
    for k, v in versions().items():
        print(f"{k:<12} {v if v is not None else 'MISSING'}")
    return 0


def _cmd_check(args) -> int:
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


def _cmd_clusters(args) -> int:
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


def _cmd_plan(args) -> int:
    from ddlcourse import plan
    return plan.main_measure(args.scale) if args.measure else plan.main(args.scale)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions")
    c = sub.add_parser("check", help="allreduce three ways (under mpiexec)")
    c.add_argument("--length", type=int, default=4)
    c.add_argument("--ids", action="store_true", help="only show and check where each rank runs (host, local rank, GPU)")
    c.add_argument("--expect-ranks", type=int, default=None, help="fail unless the MPI world has this many ranks")
    c.add_argument("--require-cuda", action="store_true", help="fail when a rank has no GPU (a GPU allocation)")
    cl = sub.add_parser("clusters", help="list or stop course clusters")
    cl.add_argument("action", choices=["list", "stop-all"])
    cl.add_argument("--orphans", action="store_true", help="only clusters whose starting process is gone")
    pl = sub.add_parser("plan", help="memory budget per GPU and per node of every section")
    pl.add_argument("--scale", default="cluster", help="smoke | laptop | cluster (default: cluster)")
    pl.add_argument("--measure", action="store_true",
                    help="on a GPU: run each workload once and compare the allocator's peak with the estimate")
    # listed for the overview only: `run` has its own parser (ddlcourse.training.cli), reached below
    sub.add_parser("run", help="train a case study (run CASE --help: its settings)", add_help=False)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:
        from ddlcourse.training import cli as run_cli
        return run_cli.main(argv[1:])
    args = p.parse_args(argv)
    try:
        if args.cmd == "info":
            return _cmd_info(args)
        if args.cmd == "check":
            return _cmd_check(args)
        if args.cmd == "clusters":
            return _cmd_clusters(args)
        return _cmd_plan(args)
    except (ValueError, FileNotFoundError) as e:  # bad input: a clear message, not a traceback
        print(f"python -m ddlcourse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
