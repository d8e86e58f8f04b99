"""Rehearse the class on two nodes: every notebook and lab under nbval, with its engines on both nodes.

    sudo .venv/bin/python env/multinode/rehearse.py                  # every notebook and lab (make rehearsal)
    sudo .venv/bin/python env/multinode/rehearse.py notebooks/12e*.ipynb --workers 1

This is the class the way env/slurm/jupyter.sbatch runs it, on this one machine: two Slurm nodes
(env/multinode/two_nodes.sh: each its own network, hostname, /dev/shm and temporary folder), one allocation
of 2 nodes x 2 tasks, and the notebooks' kernels on node 1 inside it. There ``cluster.MPICluster()`` sees
the allocation and starts its engines with srun on both nodes, as in a class; results and the clusters'
runtime records go to the shared checkout, as on a cluster's shared file system. What only several nodes
show fails here: a server on 127.0.0.1, a file in node-local /tmp read on the other node, a PID signalled on
the wrong host, a second job step that waits behind the engines.

After the notebooks, while the allocation is still alive (so Slurm has cleaned nothing up yet), each node
must hold nothing but the Slurm daemons: a leak fails the rehearsal. It also fails when no engine ran on
node 2. Notebooks that fail are run once more in the same allocation, and the report names them
("RETRIED"): a flaw of the course fails twice, while a launch broken by this one-machine Slurm (the PMI
limit of env/slurm/README.md, a node slow under load) passes the second time. A cell that runs longer than
CELL_TIMEOUT fails, so a hang costs minutes and names its cell. The nodes are torn down however it ends. Exit status: pytest's, or 1 for a leak, 3 when two nodes
cannot be built here (needs root, network namespaces, and Debian's slurm-wlm + munge).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from harness import NODES, TwoNodes, children  # noqa: E402

PY = sys.executable
TASKS_PER_NODE = 2   # 4 engines in all: what the smoke and laptop scales start at most (checks.engines_needed)
DONE = "REHEARSAL-PYTEST-DONE"
CELL_TIMEOUT = 300   # s; the slowest cell takes about 40 s here, so a hang fails in minutes and names its cell


def notebooks(paths: list[str]) -> list[str]:
    if paths:
        missing = [p for p in paths if not (ROOT / p).is_file()]
        if missing:
            raise SystemExit(f"rehearse: no such notebook: {', '.join(missing)}")
        return paths
    return sorted(str(p.relative_to(ROOT)) for d in ("notebooks", "labs") for p in (ROOT / d).glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", help="notebooks to run (default: every notebook and lab)")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", 2)),
                    help="pytest-xdist workers inside the allocation (default $WORKERS or 2)")
    ap.add_argument("--scale", default=os.environ.get("DDLCOURSE_SCALE", "smoke"))
    ap.add_argument("--time-limit", type=int, default=80, help="the allocation's --time, in minutes")
    args = ap.parse_args(argv)
    nbs = notebooks(args.notebooks)

    state = Path(tempfile.mkdtemp(prefix="ddl-rehearsal-"))
    nodes = TwoNodes(state)
    why = nodes.unavailable()
    if why:
        print(f"[rehearsal] cannot build two nodes here: {why}", file=sys.stderr)
        return 3
    # a TERM (CI's time limit, a Ctrl-C'd make) ends the run through the finally below: nodes down, folders gone
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    nodes.guard()
    run_id = f"rehearsal-{os.getpid()}"
    runtime = ROOT / ".test-runtime" / run_id          # shared by both nodes, as a cluster's home is
    results = ROOT / ".test-runtime" / f"{run_id}-results"
    t0 = time.perf_counter()
    try:
        print(f"[rehearsal] two nodes and Slurm up in {nodes.up():.1f} s ({state})", flush=True)
        srun_mpi = subprocess.run([PY, "-m", "ddlcourse", "srun-mpi"], capture_output=True, text=True,
                                  cwd=ROOT).stdout.strip() or "pmi2"
        env = nodes.env(DDLCOURSE_PYTHON=PY, DDLCOURSE_SCALE=args.scale, DDLCOURSE_SRUN_MPI=srun_mpi,
                        DDLCOURSE_CPU_BIND="none", DDLCOURSE_TEST_RUN=run_id, DDLCOURSE_RUNTIME_DIR=str(runtime),
                        DDLCOURSE_RESULTS=str(results), OMP_NUM_THREADS="1", MPLBACKEND="Agg",
                        PYTHONHASHSEED="0", PYDEVD_DISABLE_FILE_VALIDATION="1", PYTHONUNBUFFERED="1")
        pytest = [PY, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", "--durations", "10",
                  "-v", "--nbval-lax", "--nbval-sanitize-with", "tests/sanitize.cfg",
                  "--nbval-cell-timeout", str(CELL_TIMEOUT)]
        pytest += ["-n", str(args.workers), "--dist", "loadfile"] if args.workers > 1 else ["-p", "no:xdist"]
        # the shell inside the allocation: for each line we send, pytest on those notebooks, then say so and hold
        # the allocation until we have looked; an empty line ends it
        script = f'while read -r nbs && [ -n "$nbs" ]; do "$@" $nbs </dev/null; echo "{DONE} $?"; done'
        print(f"[rehearsal] {len(nbs)} notebook(s) at scale {args.scale}, inside salloc -N2 "
              f"--ntasks-per-node={TASKS_PER_NODE}, srun --mpi={srun_mpi}, {args.workers} worker(s)", flush=True)
        proc = nodes.popen(1, ["salloc", "-N2", f"--ntasks-per-node={TASKS_PER_NODE}", "--immediate=120",
                               f"--time={args.time_limit}", "sh", "-c", script, "sh", *pytest],
                           env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rc, first_rc, leaks, job, failed, retried = None, None, {}, None, set(), []
        proc.stdin.write(" ".join(nbs) + "\n")
        proc.stdin.flush()
        try:
            for line in proc.stdout:
                print(line, end="", flush=True)
                job = job or (re.search(r"Granted job allocation (\d+)", line) or [None, None])[1]
                bad = re.match(r"(?:FAILED|ERROR) ((?:notebooks|labs)/\S+?\.ipynb)", line)
                if bad:
                    failed.add(bad[1])
                if line.startswith(DONE):
                    rc = int(line.split()[1])
                    allowed = {proc.pid, *children(proc.pid)}   # salloc and its shell
                    for pid in list(allowed):
                        allowed.update(children(pid))
                    leaks = {i: nodes.wait_clean(i, allowed) for i in (1, 2)}
                    again = ""
                    if first_rc is None and rc != 0 and failed and not any(leaks.values()):
                        # once, the notebooks that failed: a flaw of the course fails again; a launch broken by
                        # this one-machine Slurm (PMI, a slow node) passes, and the report says it happened
                        first_rc, retried = rc, sorted(failed)
                        failed = set()
                        print(f"[rehearsal] {len(retried)} notebook(s) failed; running them once more: "
                              f"{' '.join(retried)}", flush=True)
                        again = " ".join(retried)
                    proc.stdin.write(again + "\n")
                    proc.stdin.flush()
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc is None:
            print(f"[rehearsal] FAIL: the allocation ended before pytest did (salloc exit {proc.returncode})\n"
                  f"{nodes.logs()}")
            return 1
        on_node2 = 0
        if job:
            log2 = (state / "log" / f"slurmd-{NODES[2][0]}.log").read_text(errors="replace")
            on_node2 = len(re.findall(rf"launch task StepId={job}\.\d+ ", log2))
        minutes = (time.perf_counter() - t0) / 60
        print(f"[rehearsal] pytest exit {rc}; {on_node2} job step(s) ran on {NODES[2][0]}; {minutes:.1f} min")
        if retried:
            verdict = "passed" if rc == 0 else "FAILED again"
            print(f"[rehearsal] RETRIED: {' '.join(retried)} failed in the first pass (pytest exit {first_rc}) and "
                  f"{verdict} in the second; the first pass's failures are above")
        left = {i: procs for i, procs in leaks.items() if procs}
        if left:
            print("[rehearsal] FAIL: left running after the notebooks, with the allocation still alive:")
            for i, procs in left.items():
                for pid, cmd in procs:
                    print(f"  {NODES[i][0]} pid {pid}: {(cmd or '')[:160]}")
            return 1
        if rc == 0 and on_node2 == 0:
            print(f"[rehearsal] FAIL: no engine ran on {NODES[2][0]}: the notebooks did not use the allocation")
            return 1
        return rc
    finally:
        try:
            nodes.down()      # a TERM that comes during it is held until the nodes are gone, then ends us
        finally:
            subprocess.run(["rm", "-rf", str(runtime), str(results), str(state)], check=False)


if __name__ == "__main__":
    sys.exit(main())
