"""Command line of the course:  python -m ddlcourse <command>

  info                         versions of everything the course runs on
  check                        allreduce three ways (run it under: mpiexec -n 2 python -m ddlcourse check)
  clusters list|stop-all       course clusters recorded as running; stop them all
  run CASE [--scale S] [--backend ddp|horovod] [...]
                               train a case study (run under mpiexec -n N or srun)
"""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_info(args) -> int:
    from ddlcourse import versions
    for k, v in versions().items():
        print(f"{k:<12} {v if v is not None else 'MISSING'}")
    return 0


def _cmd_check(args) -> int:
    from ddlcourse import checks, dist
    res = checks.allreduce_three_ways(args.length)
    from mpi4py import MPI
    allres = MPI.COMM_WORLD.gather(res, root=0)
    ok = True
    if dist.rank() == 0:
        n = dist.world_size()
        for r in allres:
            print(f"rank {r['rank']}: mpi4py={r['mpi4py']} torch.distributed={r['torch.distributed']} horovod={r['horovod']}")
        ok = checks.agree(allres, n, args.length)
        print(f"all three agree with the expected sum {checks.expected_sum(n, args.length)}: {ok}")
    ok = MPI.COMM_WORLD.bcast(ok, root=0)
    dist.shutdown()
    return 0 if ok else 1


def _cmd_clusters(args) -> int:
    from ddlcourse import cluster
    if args.action == "list":
        rows = cluster.recorded_clusters()
        for f, st in rows:
            alive = st.get("parent_pid") and cluster._alive(st["parent_pid"])
            print(f"{st.get('cluster_id', f.name)}  n={st.get('n')}  started by pid {st.get('parent_pid')}"
                  f" ({'alive' if alive else 'gone'})")
        if not rows:
            print("no course clusters recorded in", cluster.runtime_dir())
    else:
        n = cluster.stop_all(only_orphans=args.orphans)
        print(f"stopped {n} cluster(s)")
    return 0


def _cmd_run(args, extra) -> int:
    from ddlcourse import cases
    return cases.main(args.case, extra, scale=args.scale, backend=args.backend)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddlcourse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions")
    c = sub.add_parser("check", help="allreduce three ways (under mpiexec)")
    c.add_argument("--length", type=int, default=4)
    cl = sub.add_parser("clusters", help="list or stop course clusters")
    cl.add_argument("action", choices=["list", "stop-all"])
    cl.add_argument("--orphans", action="store_true", help="only clusters whose starting process is gone")
    r = sub.add_parser("run", help="train a case study")
    r.add_argument("case")
    r.add_argument("--scale", default=None, help="smoke | laptop | cluster (default: $DDLCOURSE_SCALE or laptop)")
    r.add_argument("--backend", default="ddp", help="ddp | horovod")
    args, extra = p.parse_known_args(argv)
    if args.cmd != "run" and extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.cmd == "info":
            return _cmd_info(args)
        if args.cmd == "check":
            return _cmd_check(args)
        if args.cmd == "clusters":
            return _cmd_clusters(args)
        return _cmd_run(args, extra)
    except (ValueError, FileNotFoundError) as e:  # bad input: a clear message, not a traceback
        print(f"python -m ddlcourse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
