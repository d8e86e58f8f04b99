"""Environment checks: does MPI, torch.distributed and Horovod each work, and do they agree?

* Notebook 00 and ``python -m ddlcourse check``: :func:`allreduce_three_ways` and :func:`agree`, plus the
  allreduces that depend on where the tensor lives (:func:`device_allreduces`): a CPU tensor through the
  default torch.distributed group, and on CUDA ranks a CUDA tensor through torch.distributed and Horovod.
* ``python -m ddlcourse check --ids``: where each rank runs (:func:`placement`, :func:`placement_problems`).
* The Slurm templates and ``env/gpu_smoke.sh`` (``python -m ddlcourse srun-mpi|engines|build|device-use``): the ``srun --mpi``
  plugin that matches the MPI mpi4py was built with (:func:`srun_mpi_plugin`), how many engines the
  notebooks start at a scale (:func:`engines_needed`), the CUDA/NCCL build (:func:`build_report`).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import runpy
import socket
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist

from ddlcourse import config, dist
# srun's --mpi plugin is worked out where launch commands are built (cluster.launch); `srun-mpi` prints it
from ddlcourse.cluster.launch import srun_mpi_plugin

SKIP_NO_CUDA = "skipped (no CUDA)"


def rank_vector(rank: int, length: int) -> np.ndarray:
    """Rank r contributes [r+1, r+1, ...]: the sum over N ranks is N(N+1)/2 in every entry."""
    return np.full(length, rank + 1, dtype=np.float64)


def expected_sum(world_size: int, length: int) -> list[float]:
    return [world_size * (world_size + 1) / 2] * length


def allreduce_three_ways(length: int = 4) -> dict:
    """On every rank: sum ``rank_vector`` over all ranks with mpi4py, torch.distributed and Horovod.

    ``torch.distributed`` sums a tensor on the rank's device (CUDA with nccl, else CPU with gloo); Horovod
    a CPU tensor. ``devices`` holds the device-dependent allreduces of :func:`device_allreduces`.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    info = dist.init(horovod=True)
    x = rank_vector(info.rank, length)

    out_mpi = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, out_mpi, op=MPI.SUM)

    t = torch.from_numpy(x.copy()).to(info.device)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)

    import horovod.torch as hvd  # lazy: Horovod is optional (not every install builds it)
    h = hvd.allreduce(torch.from_numpy(x.copy()), op=hvd.Sum, name="setup_check")

    return {"rank": info.rank, "mpi4py": out_mpi.tolist(), "torch.distributed": t.cpu().tolist(),
            "horovod": h.tolist(), "backend": info.backend, "device": str(info.device),
            "devices": device_allreduces(info, length)}


def _one_allreduce(name: str, fn, want: list[float]) -> dict:
    """Run one allreduce; never raise (a failing path is reported, and the other paths still run)."""
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 -- the message is the result of the check
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return {"name": name, "status": "error", "value": None, "detail": f"{type(e).__name__}: {msg}"}
    return {"name": name, "status": "ok" if got == want else "wrong", "value": got, "detail": ""}


def device_allreduces(info, length: int = 4) -> list[dict]:
    """The allreduces whose path depends on the tensor's device, each ``{name, status, value, detail}``.

    ``status`` is ``ok``, ``wrong`` (a sum other than N(N+1)/2), ``error`` (it raised: ``detail`` says why)
    or ``skipped`` (no CUDA on this rank, or not on every rank). Collective: every rank calls it.

    * CPU tensor through the default torch.distributed group: with NCCL alone, torch raises "No backend
      type associated with device type cpu"; a CPU+CUDA default group (``cpu:gloo,cuda:nccl``) sums it.
    * CUDA tensor through torch.distributed (nccl) and through Horovod (NCCL when Horovod was built with
      ``HOROVOD_GPU_OPERATIONS=NCCL``; otherwise this is reported as an error).
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    want = expected_sum(info.world_size, length)
    x = rank_vector(info.rank, length)
    backend = tdist.get_backend()

    def torch_sum(device):
        t = torch.from_numpy(x.copy()).to(device)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t.cpu().tolist()

    out = [_one_allreduce(f"cpu tensor via torch.distributed (default group, {backend})", lambda: torch_sum("cpu"), want)]

    has_cuda = info.device.type == "cuda"
    # A CUDA collective on some ranks only would hang the others: run them only when every rank has CUDA.
    all_cuda = MPI.COMM_WORLD.allreduce(has_cuda, op=MPI.LAND)
    names = ("cuda tensor via torch.distributed", "cuda tensor via Horovod")
    if not all_cuda:
        why = SKIP_NO_CUDA if not has_cuda else "skipped (not every rank has CUDA)"
        return out + [{"name": n, "status": "skipped", "value": None, "detail": why} for n in names]

    out.append(_one_allreduce(f"{names[0]} ({backend})", lambda: torch_sum(info.device), want))

    def hvd_sum():
        import horovod.torch as hvd  # lazy: Horovod is optional (not every install builds it)
        if not hvd.nccl_built():
            raise RuntimeError("Horovod was built without NCCL: rebuild it with env/build_horovod_gpu.sh "
                               "(HOROVOD_GPU_OPERATIONS=NCCL)")
        t = hvd.allreduce(torch.from_numpy(x.copy()).to(info.device), op=hvd.Sum, name="setup_check_cuda")
        return t.cpu().tolist()

    out.append(_one_allreduce(f"{names[1]} (NCCL)", hvd_sum, want))
    return out


def tf32_state() -> dict:
    """Whether TF32 is allowed for matmuls and cuDNN convolutions (the course's agreement checks want it off)."""
    return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)}


def agree(results: list[dict], world_size: int, length: int, require_cuda: bool = False) -> bool:
    """All three methods, on every rank, equal the known sum, and no device-dependent allreduce failed.

    ``require_cuda=True`` also counts a skipped CUDA allreduce as a failure (a GPU allocation).
    """
    want = expected_sum(world_size, length)
    if not all(r[k] == want for r in results for k in ("mpi4py", "torch.distributed", "horovod")):
        return False
    bad = {"wrong", "error"} | ({"skipped"} if require_cuda else set())
    return not any(d["status"] in bad for r in results for d in r.get("devices", []))


# --------------------------------------------------------------------------------- where each rank runs
def _gpu_identity(idx: int) -> str:
    """A name for the physical GPU behind ``cuda:idx`` that is the same whatever CUDA_VISIBLE_DEVICES says."""
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    if uuid:
        return f"GPU-{uuid}"
    if hasattr(props, "pci_bus_id"):
        return f"pci {getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"visible[{visible.split(',')[idx]}]" if visible else f"index {idx}"


def placement() -> dict:
    """Where this rank runs: rank, host, the local rank ``dist`` uses and the one MPI's shared-memory split
    gives, its device and the physical GPU behind it, and ``CUDA_VISIBLE_DEVICES``. Collective.

    Does not start torch.distributed or Horovod, so a broken NCCL cannot hide a wrong placement.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI, wanted on the ranks only

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    node_rank, node_size = node.Get_rank(), node.Get_size()
    node.Free()
    try:
        dev, problem = dist.pick_device(), None
    except Exception as e:  # noqa: BLE001 -- e.g. dist.LaunchError: more ranks on this node than GPUs
        dev, problem = None, f"rank {world.Get_rank()}: {e}"
    row = dict(rank=world.Get_rank(), size=world.Get_size(), host=socket.gethostname(), pid=os.getpid(),
               local_rank=dist.local_rank(), node_rank=node_rank, node_size=node_size,
               device=str(dev) if dev is not None else "none", problem=problem,
               gpu=None, gpu_name=None, n_visible=torch.cuda.device_count() if torch.cuda.is_available() else 0,
               cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if dev is not None and dev.type == "cuda":
        row.update(gpu=_gpu_identity(dev.index), gpu_name=torch.cuda.get_device_name(dev))
    return row


def placement_problems(rows: list[dict], expect_ranks: int | None = None, require_gpu: bool = False) -> list[str]:
    """What is wrong with a placement (empty list: every rank sits where the course says it should).

    The rules: one MPI world of the expected size; on every host the local ranks are 0..k-1 and equal the
    rank's place among the ranks of its node; with GPUs, every rank of a host has its own physical GPU.
    """
    problems = []
    n = len(rows)
    if expect_ranks is not None and n != expect_ranks:
        hint = (": every process is its own MPI world of size 1, so the launcher and the MPI do not match "
                "(srun: set DDLCOURSE_SRUN_MPI to the plugin of the MPI mpi4py uses, see `srun --mpi=list`)"
                if n == 1 else "")
        problems.append(f"{expect_ranks} rank(s) expected, the MPI world has {n}{hint}")
    if any(r["size"] != n for r in rows):
        problems.append(f"ranks disagree on the world size: {sorted({r['size'] for r in rows})}")
    problems += [r["problem"] for r in rows if r.get("problem")]
    hosts: dict[str, list[dict]] = {}
    for r in rows:
        hosts.setdefault(r["host"], []).append(r)
    for host, rs in sorted(hosts.items()):
        locs = sorted(r["local_rank"] for r in rs)
        if locs != list(range(len(rs))):
            problems.append(f"{host}: local ranks are {locs}, expected 0..{len(rs) - 1} "
                            "(a launcher variable such as SLURM_LOCALID inherited from the job step?)")
        for r in rs:
            if r["local_rank"] != r["node_rank"]:
                problems.append(f"{host}: rank {r['rank']} uses local rank {r['local_rank']} but is number "
                                f"{r['node_rank']} of the {r['node_size']} rank(s) on its node")
        cuda = [r for r in rs if r["gpu"]]
        if require_gpu and len(cuda) != len(rs):
            problems.append(f"{host}: rank(s) {[r['rank'] for r in rs if not r['gpu']]} have no CUDA device")
        seen: dict[str, int] = {}
        for r in cuda:
            if r["gpu"] in seen:
                problems.append(f"{host}: ranks {seen[r['gpu']]} and {r['rank']} share one GPU ({r['gpu']}); "
                                f"{len(rs)} rank(s) on this node see {r['n_visible']} GPU(s)")
            seen.setdefault(r["gpu"], r["rank"])
    return problems


def format_placement(rows: list[dict]) -> list[str]:
    """One line per rank: rank, host, local rank, device, physical GPU, CUDA_VISIBLE_DEVICES."""
    lines = [f"{'rank':>4} {'host':<20} {'local':>5} {'device':<8} {'gpu':<44} CUDA_VISIBLE_DEVICES"]
    for r in sorted(rows, key=lambda r: r["rank"]):
        gpu = f"{r['gpu']} ({r['gpu_name']})" if r["gpu"] else "-"
        cvd = {None: "(unset)", "": '"" (no GPU visible)'}.get(r["cuda_visible_devices"], r["cuda_visible_devices"])
        lines.append(f"{r['rank']:>4} {r['host'][:20]:<20} {r['local_rank']:>5} {r['device']:<8} {gpu:<44} {cvd}")
    return lines


# --------------------------------------------------------------------------------- engines per scale
_STARTERS = ("start", "MPICluster")          # cluster.start(n=...), cluster.MPICluster(n=...)


def _profile_engines(section: str, scale: str) -> int:
    """The largest ``n_ranks``/``n_engines`` of ``section`` at ``scale`` (0: it names none)."""
    sizes = config.PROFILES.get(section, {}).get(scale, {})
    return max([v for k, v in sizes.items() if k in ("n_ranks", "n_engines") and isinstance(v, int)], default=0)


def notebook_paths() -> list:
    """The course's notebooks and labs (none when the package runs outside its checkout)."""
    root = Path(__file__).resolve().parent.parent
    return sorted((root / "notebooks").glob("*.ipynb")) + sorted((root / "labs").glob("*.ipynb"))


def notebook_clusters(path, scale: str | None = None) -> dict:
    """The clusters a notebook starts, and the most engines it has alive at once, at ``scale``.

    Read from the code cells in order, without running them: a cluster starts at ``cluster.start(n=...)`` or
    ``cluster.MPICluster(n=...)``; one bound with ``c = ...`` lives until ``c.stop()`` (or the notebook's end),
    one opened with ``with ... as c:`` (or ``with c:``) until its block ends. ``n`` is read from the notebook's
    sizes (``S = config.sizes("section")``, ``S.n_ranks``), a number, or ``max``/``min`` of those; any other
    expression (08's ``max(ranks)``, ranks bounded by ``S.n_ranks``) counts as the section's ``n_ranks`` or
    ``n_engines`` (else its largest ``n_*`` size), marked ``exact=False``.

    Returns ``{"section", "clusters": [{"cell", "line", "n", "expr", "exact", "alive_with"}], "peak"}``:
    ``alive_with`` are the indices of the clusters still alive when this one starts, and ``peak`` the most
    engines alive at the same time (notebook 26: its n_load engines stay up while n_save more save a checkpoint).
    """
    scale = config.get_scale(scale)
    nb = json.loads(open(path).read())
    sizes: dict[str, tuple[str, str]] = {}      # name -> (section, scale)
    state = {"section": None, "clusters": [], "alive": {}, "peak": 0}

    def sizes_call(node):
        """``config.sizes("sec"[, scale=...])`` -> (section, scale), else None."""
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sizes"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            sc = next((k.value.value for k in node.keywords if k.arg == "scale" and isinstance(k.value, ast.Constant)),
                      None)
            if sc is None and state["section"] is None:
                state["section"] = node.args[0].value
            return node.args[0].value, sc or scale
        return None

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Attribute):
            src = sizes.get(node.value.id) if isinstance(node.value, ast.Name) else sizes_call(node.value)
            if src is not None:
                v = config.PROFILES.get(src[0], {}).get(src[1], {}).get(node.attr)
                return v if isinstance(v, int) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min") \
                and node.args and not node.keywords:
            vals = [value(a) for a in node.args]
            if None not in vals:
                return max(vals) if node.func.id == "max" else min(vals)
        return None

    def is_start(node) -> bool:
        f = getattr(node, "func", None)
        return isinstance(node, ast.Call) and (
            (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "cluster"
             and f.attr in _STARTERS) or (isinstance(f, ast.Name) and f.id == "MPICluster"))

    def start(call, cell, name):
        arg = next((k.value for k in call.keywords if k.arg == "n"), call.args[0] if call.args else None)
        n = value(arg) if arg is not None else None
        exact = n is not None
        if n is None:                            # bounded by the section's counts (08: ranks <= S.n_ranks)
            sec = config.PROFILES.get(state["section"] or "", {}).get(scale, {})
            n = _profile_engines(state["section"] or "", scale) or max(
                [v for k, v in sec.items() if k.startswith("n_") and isinstance(v, int)], default=0)
        idx = len(state["clusters"])
        state["clusters"].append(dict(cell=cell, line=call.lineno, n=n, exact=exact,
                                      expr=ast.unparse(arg) if arg is not None else "(default)",
                                      alive_with=sorted(i for i in state["alive"].values())))
        key = name if name is not None else f"<anonymous {idx}>"
        if key in state["alive"]:                # rebound while alive: the old one stays up, under a new key
            state["alive"][f"<lost {state['alive'][key]}>"] = state["alive"].pop(key)
        state["alive"][key] = idx
        state["peak"] = max(state["peak"], sum(state["clusters"][i]["n"] for i in state["alive"].values()))
        return key

    def visit(stmts, cell):
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(st, ast.Assign):
                src = sizes_call(st.value)
                if src is not None:
                    for t in st.targets:
                        if isinstance(t, ast.Name):
                            sizes[t.id] = src
                    continue
                if is_start(st.value) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                    start(st.value, cell, st.targets[0].id)
                    continue
            if isinstance(st, (ast.With, ast.AsyncWith)):
                opened = []
                for item in st.items:
                    ce, var = item.context_expr, item.optional_vars
                    if is_start(ce):
                        opened.append(start(ce, cell, var.id if isinstance(var, ast.Name) else None))
                    elif isinstance(ce, ast.Name) and ce.id in state["alive"]:
                        opened.append(ce.id)
                    else:
                        scan(ce, cell)
                visit(st.body, cell)
                for key in opened:
                    state["alive"].pop(key, None)
                continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                    and isinstance(st.value.func, ast.Attribute) and st.value.func.attr == "stop" \
                    and isinstance(st.value.func.value, ast.Name) and st.value.func.value.id in state["alive"]:
                state["alive"].pop(st.value.func.value.id)
                continue
            bodies = [getattr(st, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(st, f, None), list)]
            bodies += [h.body for h in getattr(st, "handlers", [])]
            if bodies:                            # if / for / while / try: their statements, in order
                for field_name in ("test", "iter"):
                    if getattr(st, field_name, None) is not None:
                        scan(getattr(st, field_name), cell)
                for b in bodies:
                    visit(b, cell)
                continue
            scan(st, cell)

    def scan(node, cell):
        """Any other start inside an expression: a cluster nothing stops (alive to the end)."""
        for sub in ast.walk(node):
            sizes_call(sub)
            if is_start(sub):
                start(sub, cell, None)

    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        src = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        visit(tree.body, i)
    return dict(section=state["section"], clusters=state["clusters"], peak=state["peak"])


def engines_needed(scale: str | None = None) -> dict[str, int]:
    """Engines alive at once in each notebook section at ``scale``, largest first.

    A section's count is its profile's ``n_ranks``/``n_engines``, or more where its notebook keeps clusters
    alive together (:func:`notebook_clusters`: notebook 26's ``n_load`` engines stay up while ``n_save`` more start).
    """
    scale = config.get_scale(scale)
    out = {}
    for section in config.PROFILES:
        n = _profile_engines(section, scale)
        if n:
            out[section] = n
    for path in notebook_paths():
        found = notebook_clusters(path, scale)
        if found["section"] and found["peak"] > out.get(found["section"], 0):
            out[found["section"]] = found["peak"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def allocation_advice(scale: str | None, ntasks: int, gpus_per_node: int | None = None,
                      tasks_per_node: int | None = None) -> list[str]:
    """Warnings (empty: none) when an allocation of ``ntasks`` cannot run every notebook at ``scale``."""
    need = engines_needed(scale)
    out = []
    big = {s: n for s, n in need.items() if n > ntasks}
    if big:
        listed = ", ".join(f"{s} ({n})" for s, n in big.items())
        out.append(f"{ntasks} task(s) in this allocation, but at scale {scale!r} these sections have more "
                   f"engines alive at once: {listed}. Ask for at least {max(big.values())} tasks, or set DDLCOURSE_SCALE lower.")
    if gpus_per_node and tasks_per_node and tasks_per_node > gpus_per_node:
        out.append(f"{tasks_per_node} tasks per node but {gpus_per_node} GPU(s) per node: ranks will share GPUs "
                   "(rank -> cuda:<local_rank % n_gpus>). Ask for one task per GPU.")
    return out


# --------------------------------------------------------------------------------- CUDA / NCCL build
def build_report(require_gpu: bool = False) -> tuple[list[str], list[str]]:
    """``(lines, problems)``: torch, CUDA, NCCL and Horovod as built here. Starts no process group."""
    lines = [f"host {socket.gethostname()}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"gloo {tdist.is_gloo_available()}, nccl {tdist.is_nccl_available()}"]
    problems = []
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n:
        names = sorted({torch.cuda.get_device_name(i) for i in range(n)})
        lines.append(f"{n} GPU(s): {', '.join(names)}; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    elif require_gpu:
        problems.append(f"torch sees no GPU on {socket.gethostname()} (CUDA_VISIBLE_DEVICES="
                        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}, torch CUDA {torch.version.cuda})")
    if require_gpu and not tdist.is_nccl_available():
        problems.append("this torch has no NCCL backend (a CPU build?)")
    try:
        import horovod.torch as hvd  # lazy: Horovod is optional (not every install builds it)
        built = {k: bool(getattr(hvd, f"{k}_built")()) for k in ("mpi", "gloo", "nccl", "cuda")}
        lines.append("Horovod: " + ", ".join(f"{k} {v}" for k, v in built.items()))
        if require_gpu and not built["nccl"]:
            problems.append("Horovod was built without NCCL: rebuild with env/build_horovod_gpu.sh")
    except ImportError as e:
        problems.append(f"Horovod does not import: {e}")
    return lines, problems


def device_use(argv: list[str]) -> int:
    """Run ``python -m ddlcourse <argv>`` in this process, then print on every rank which device it used:
    ``device-use: rank r on host: cuda:i peak N bytes`` (torch's peak allocation), or ``cpu``.

    A lab that leaves its model or batches on the CPU of a GPU rank allocates nothing on the GPU: the
    smoke test (env/gpu_smoke.sh) fails it on that line. The command line runs as ``python -m`` runs it
    (``runpy``).
    """
    saved = sys.argv
    sys.argv = ["python -m ddlcourse", *argv]
    try:
        runpy.run_module("ddlcourse", run_name="__main__", alter_sys=True)
        rc = 0
    except SystemExit as e:            # its last line is sys.exit(main())
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    from mpi4py import MPI  # lazy: MPI starts only where a launcher runs this command
    r = MPI.COMM_WORLD.Get_rank()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
        print(f"device-use: rank {r} on {socket.gethostname()}: cuda:{torch.cuda.current_device()} peak {peak} bytes",
              flush=True)
    else:
        print(f"device-use: rank {r} on {socket.gethostname()}: cpu", flush=True)
    return rc


# --------------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    """``python -m ddlcourse srun-mpi|engines|build|device-use`` (env/slurm/ and env/gpu_smoke.sh)."""
    p = argparse.ArgumentParser(prog="python -m ddlcourse", description=main.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("srun-mpi", help="the srun --mpi plugin for the MPI mpi4py was built with")
    s.add_argument("--explain", action="store_true", help="also say why (on stderr)")
    e = sub.add_parser("engines", help="engines the notebooks start at a scale; warn when an allocation is too small")
    e.add_argument("--scale", default=None)
    e.add_argument("--tasks", type=int, default=None, help="tasks in the allocation (warn when too few)")
    e.add_argument("--gpus-per-node", type=int, default=None)
    e.add_argument("--tasks-per-node", type=int, default=None)
    b = sub.add_parser("build", help="torch / CUDA / NCCL / Horovod build on this host")
    b.add_argument("--require-gpu", action="store_true")
    d = sub.add_parser("device-use", help="run `python -m ddlcourse ARGS...`, then print each rank's peak CUDA memory")
    d.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.cmd == "device-use":
        return device_use(a.args)
    if a.cmd == "srun-mpi":
        plugin, why = srun_mpi_plugin()
        print(plugin)
        if a.explain:
            print(f"srun --mpi={plugin}: {why}", file=sys.stderr)
        return 0
    if a.cmd == "engines":
        need = engines_needed(a.scale)
        if a.tasks is None:
            print(max(need.values(), default=0))
            return 0
        advice = allocation_advice(a.scale, a.tasks, a.gpus_per_node, a.tasks_per_node)
        for line in advice:
            print(f"WARNING: {line}")
        return 1 if advice else 0
    lines, problems = build_report(a.require_gpu)
    for line in lines:
        print(line)
    for line in problems:
        print(f"PROBLEM: {line}")
    return 1 if problems else 0
