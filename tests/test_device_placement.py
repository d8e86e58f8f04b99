"""Device placement: what the ranks build lives on the rank's device, checked without a GPU.

On a GPU node ``dist.init().device`` is ``cuda:<local rank>``. A helper that builds its model or a tensor
on the CPU there either trains on the CPU or crashes ("Expected all tensors to be on the same device").
A CPU-only CI never sees that, so this file makes the mistake visible in two ways:

1. **Statically** (AST), in every function of the modules whose helpers the notebooks run on the engines:

   * a tensor factory (``torch.zeros``, ``torch.randn``, ``torch.arange``, ...) or a model construction
     (``nn.Linear``, ``nn.Conv2d``, ..., the course models of ``ddlcourse.models``) must pass ``device=``,
     or lie inside the receiver of a ``.to(<device>)`` (a ``.to`` that names a device, not only a dtype), or be
     stored in a name (or appended to a list) that goes through such a ``.to`` in the same function
     (``layers.append(nn.Linear(...))`` ... ``nn.Sequential(*layers).to(device)``);
   * a function with a ``device`` parameter passes it on to every course function it calls that takes one;
   * every function a notebook (03-13) sends to the engines takes a ``device`` argument, unless it builds no
     tensors at all (listed below with the reason).

   Exceptions are listed in :data:`HOST_ON_PURPOSE`, each with its reason.
2. **At run time**: the builders put their models and data on a device that is not the CPU (``meta``), both
   when it is passed and when it comes from the rank (``dist.init``/``placement.pick_device`` patched).
3. **An MPI rank without torch.distributed** (a parameter server's worker, a search's trial on an engine) takes
   the GPU of its own local rank (CUDA faked to show 4 GPUs), found without a collective call.
4. **A lesson about CPU transports** (notebook 07's comparison of DDP hooks) stays on CPU tensors when the rank's
   device is not the CPU.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from ddlcourse.cluster import placement

from helpers import module_command, run_ranks, top_level_functions

ROOT = Path(__file__).resolve().parent.parent

MODULES = [
    "ddlcourse/parallel/data_parallel.py", "ddlcourse/parallel/syncbn.py", "ddlcourse/parallel/model_parallel.py",
    "ddlcourse/parallel/pipeline.py", "ddlcourse/parallel/sharded.py", "ddlcourse/parallel/spatial.py",
    "ddlcourse/parallel/tensor.py", "ddlcourse/parallel/branches.py",
    *(f"ddlcourse/experiments/{m}.py" for m in ("data_parallel", "syncbn", "model_parallel", "pipeline", "sharded",
                                                  "spatial", "tensor", "mesh")),
    "ddlcourse/integrity.py", "ddlcourse/federated.py", "ddlcourse/optim.py", "ddlcourse/collectives.py",
]

FACTORIES = {"zeros", "ones", "empty", "full", "randn", "rand", "randint", "randperm", "arange", "tensor",
             "as_tensor", "eye", "linspace", "logspace", "normal"}
LAYERS = {"Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
          "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "Embedding",
          "LSTM", "GRU", "RNN", "MultiheadAttention", "Transformer", "TransformerEncoderLayer"}
DTYPE_NAMES = {"float16", "float32", "float64", "bfloat16", "half", "float", "double", "int32", "int64", "long",
               "bool", "uint8", "int8", "int16", "complex64", "complex128"}

# Tensors that stay on the host on purpose: (module, function, text on the line) -> why.
HOST_ON_PURPOSE = {
    ("ddlcourse/parallel/model_parallel.py", "send_tensor", "header = torch.zeros(_HEADER"):
        "the message header travels through gloo; the receiver reads its numbers to allocate the buffer",
    ("ddlcourse/parallel/model_parallel.py", "send_tensor", "torch.tensor(t.shape"): "part of the host header",
    ("ddlcourse/parallel/model_parallel.py", "recv_tensor", "header = torch.empty(_HEADER"): "the host header",
}

# Functions the notebooks send to the engines that build no tensors, so they need no device: why.
NO_TENSORS = {
    "on_first_ranks": "a dispatcher: forwards its keywords (a device too) to the function it runs",
    "run_all": "forwards each experiment to integrity.run, which takes the device",
    "run_share": "forwards each keyword set to large_batch_run, which takes the device",
    "ring_pass": "NumPy buffers through mpi4py (host memory)",
    "collectives_tour": "NumPy buffers through mpi4py (host memory)",
    "check_against_mpi": "NumPy buffers through mpi4py (host memory)",
    "sweep_on": "NumPy buffers through mpi4py (host memory)",
    "fusion_demo": "NumPy buffers through mpi4py (host memory)",
    "time_mine_vs_mpi": "the learner's ring allreduce and MPI_Allreduce on NumPy buffers (host memory)",
}


# --------------------------------------------------------------------------- the static rule
def _is_dtype_expr(node: ast.AST) -> bool:
    """``torch.float64``, ``x.dtype``, ``getattr(torch, name)``: a ``.to`` with only these moves no data."""
    if isinstance(node, ast.Attribute):
        return node.attr == "dtype" or (isinstance(node.value, ast.Name) and node.value.id == "torch"
                                        and node.attr in DTYPE_NAMES)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id == "torch"
    return False


def _device_move(call: ast.Call) -> bool:
    """``x.to(device)``, ``x.to(device=..., dtype=...)``, ``x.to(y.device)``, ``x.cuda()``: not ``x.to(torch.float64)``."""
    if not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr == "cuda":
        return True
    if call.func.attr != "to":
        return False
    if any(k.arg == "device" for k in call.keywords):
        return True
    return bool(call.args) and not _is_dtype_expr(call.args[0])


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _target_names(targets) -> set[str]:
    out = set()
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.add(n.id)
    return out


class _Checker:
    """Placement findings for one function body (nested functions included: they share its names)."""

    def __init__(self, body: list[ast.stmt], course_models: set[str]):
        self.body = body
        self.nodes = [n for stmt in body for n in ast.walk(stmt)]
        self.parent: dict[ast.AST, ast.AST] = {}
        for stmt in body:
            for n in ast.walk(stmt):
                for ch in ast.iter_child_nodes(n):
                    self.parent[ch] = n
        # names bound to a layer class: Conv = nn.Conv2d if ndim == 2 else nn.Conv3d
        self.classes = set(course_models)
        for n in self.nodes:
            if isinstance(n, ast.Assign) and not isinstance(n.value, ast.Call):
                if any(isinstance(a, ast.Attribute) and a.attr in LAYERS for a in ast.walk(n.value)):
                    self.classes |= _target_names(n.targets)
        self.flows = self._flows()
        self.placed = self._placed_names()

    def constructions(self):
        for n in self.nodes:
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id == "torch" and f.attr in FACTORIES:
                    yield n, f"torch.{f.attr}"
                elif f.value.id == "nn" and f.attr in LAYERS:
                    yield n, f"nn.{f.attr}"
            elif isinstance(f, ast.Name) and f.id in self.classes:
                yield n, f.id

    def _flows(self) -> list[tuple[ast.AST, set[str]]]:
        """(value expression, names it is stored into): assignments and list.append/extend/insert."""
        out = []
        for n in self.nodes:
            if isinstance(n, ast.Assign):
                if (len(n.targets) == 1 and isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Tuple)
                        and len(n.targets[0].elts) == len(n.value.elts)):
                    out += [(v, _target_names([t])) for t, v in zip(n.targets[0].elts, n.value.elts)]
                else:
                    out.append((n.value, _target_names(n.targets)))
            elif isinstance(n, (ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                out.append((n.value, _target_names([n.target])))
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in ("append", "extend", "insert") and isinstance(n.func.value, ast.Name)):
                for a in n.args:
                    out.append((a, {n.func.value.id}))
        return out

    def _moved_subtrees(self):
        for n in self.nodes:
            if isinstance(n, ast.Call) and _device_move(n):
                yield n.func.value

    def _placed_names(self) -> set[str]:
        """Names that appear in the receiver of a device move (``model.to(device)``, ``nn.Sequential(*layers).to(...)``)."""
        placed = set()
        for sub in self._moved_subtrees():
            placed |= _names(sub)
        return placed

    def is_placed(self, call: ast.Call) -> bool:
        if any(k.arg == "device" for k in call.keywords):
            return True
        node = call
        while node in self.parent:                  # inside the receiver of a device move?
            up = self.parent[node]
            if isinstance(up, ast.Attribute) and up.value is node and isinstance(self.parent.get(up), ast.Call) \
                    and self.parent[up].func is up and _device_move(self.parent[up]):
                return True
            node = up
        for value, targets in self.flows:           # stored into a name that is placed later?
            if any(n is call for n in ast.walk(value)) and targets & self.placed:
                return True
        return False


def _course_models(tree: ast.Module) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ddlcourse.models"):
            names |= {a.asname or a.name for a in n.names}
    return names


def _params(fn) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _device_taking_callables() -> set[str]:
    """Functions and classes of the checked modules whose signature has ``device``."""
    out = set()
    for mod in MODULES:
        tree = ast.parse((ROOT / mod).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and "device" in _params(node):
                out.add(node.name)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__" and "device" in _params(item):
                        out.add(node.name)
    return out


def placement_findings(source: str, module: str = "<source>", device_takers: set[str] | None = None) -> list[str]:
    """Every violation of the rule in ``source`` (one string each, with the line)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    models = _course_models(tree)
    takers = _device_taking_callables() if device_takers is None else device_takers
    found = []
    for name, fn in top_level_functions(tree):
        chk = _Checker(fn.body, models)
        for call, what in chk.constructions():
            line = lines[call.lineno - 1]
            if chk.is_placed(call):
                continue
            if any(m == module and f == name and text in line for (m, f, text) in HOST_ON_PURPOSE):
                continue
            found.append(f"{module}:{call.lineno} in {name}(): {what}(...) is not put on the device: {line.strip()}")
        if "device" in _params(fn):
            local = set(_params(fn)) | {t for _, targets in chk.flows for t in targets}   # e.g. a model called serial
            for n in chk.nodes:
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in takers - local:
                    passes = any(k.arg == "device" for k in n.keywords) or \
                        any(isinstance(a, ast.Name) and a.id == "device" for a in n.args)
                    if not passes and n.func.id != name:
                        found.append(f"{module}:{n.lineno} in {name}(): calls {n.func.id}() without its device")
    return found


@pytest.mark.parametrize("module", MODULES)
def test_models_and_tensors_are_built_on_the_device(module):
    findings = placement_findings((ROOT / module).read_text(), module)
    assert not findings, "\n".join(findings)


# --------------------------------------------------------------------------- what the notebooks send to the engines
def _notebook_code(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _python_lines(cell: str) -> str:
    """A cell without its IPython magics (``%%px`` and ``%px`` lines)."""
    return "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))


def engine_functions() -> dict[str, set[tuple[str, str]]]:
    """``{notebook: {(module path, function)}}`` of what every notebook runs with ``c.run`` / ``on_first_ranks``."""
    out = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        if path.name == "13_scaling.ipynb":   # its engines run ddlcourse.synthetic_bench, a model of a device
            continue
        aliases, used = {}, set()
        for cell in _notebook_code(path):
            try:
                tree = ast.parse(_python_lines(cell))
            except SyntaxError:
                continue
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ddlcourse"):
                    for a in n.names:
                        aliases[a.asname or a.name] = f"{n.module}.{a.name}"
                elif isinstance(n, ast.Import):
                    for a in n.names:
                        if a.name.startswith("ddlcourse.") and a.asname:
                            aliases[a.asname] = a.name
            for pattern in (r"\.run\(\s*(\w+)\.(\w+)", r"on_first_ranks,\s*[^,]+,\s*(\w+)\.(\w+)"):
                used |= {(m.group(1), m.group(2)) for m in re.finditer(pattern, cell)}
        resolved = set()
        for alias, fn in used:
            dotted = aliases.get(alias)
            if dotted is None:
                continue
            resolved.add((dotted.replace(".", "/") + ".py", fn))
        out[path.name] = resolved
    return out


def test_the_scan_finds_the_engine_functions():
    found = engine_functions()
    assert ("ddlcourse/experiments/data_parallel.py", "train_way") in found["05_data_parallel.ipynb"]
    assert ("ddlcourse/integrity.py", "run_all") in found["03_loss_integrity.ipynb"]
    assert ("ddlcourse/experiments/pipeline.py", "compare_with_serial") in found["16_pipeline.ipynb"]
    assert ("ddlcourse/federated.py", "fedavg") in found["10_federated.ipynb"]


def test_every_engine_function_takes_a_device():
    sigs = {}
    for mod in MODULES:
        tree = ast.parse((ROOT / mod).read_text())
        for name, fn in top_level_functions(tree):
            sigs[(mod, name)] = _params(fn)
        for node in tree.body:          # ``on_first_ranks = dist.on_first_ranks``: a name for another module's
            if (isinstance(node, ast.Assign) and len(node.targets) == 1   # function (its own check is there)
                    and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Attribute)):
                sigs[(mod, node.targets[0].id)] = None
    missing = []
    for nb, fns in engine_functions().items():
        for mod, fn in sorted(fns):
            if mod not in MODULES:
                continue
            assert (mod, fn) in sigs, f"{nb} runs {mod}:{fn}, which the scan cannot find"
            assert sigs[(mod, fn)] is not None or fn in NO_TENSORS, \
                f"{nb} runs {mod}:{fn}, an alias the scan cannot see into"
            if fn not in NO_TENSORS and "device" not in sigs[(mod, fn)]:
                missing.append(f"{nb}: {mod}:{fn}")
    assert not missing, "engine functions without a device argument:\n" + "\n".join(missing)


def test_px_cells_put_model_and_data_on_the_device():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in _notebook_code(path):
            if cell.lstrip().startswith("%%px"):
                src = "def px_cell():\n" + "\n".join("    " + ln for ln in _python_lines(cell).splitlines())
                findings = placement_findings(src, path.name, device_takers=set())
                assert not findings, "\n".join(findings)


# --------------------------------------------------------------------------- the rule catches what it should
BAD = '''
import torch
from torch import nn
from ddlcourse.models.small import MLP

def train(device=None):
    model = MLP(4, 2)                                   # never moved
    x = torch.randn(8, 4)                               # never moved
    layers = [nn.Linear(4, 4)]
    head = nn.Sequential(*layers).to(torch.float64)     # a dtype cast moves nothing
    Conv = nn.Conv2d
    conv = Conv(1, 1, 3)                                # an alias of a layer class
    return demo_model(0)                                # the device is not passed on
'''
GOOD = '''
import torch
from torch import nn
from ddlcourse.models.small import MLP

def train(device=None):
    model = MLP(4, 2).to(device)
    x = torch.randn(8, 4, generator=g).to(device)
    idx = torch.arange(8, device=device)
    layers = [nn.Linear(4, 4)]
    layers.append(nn.Linear(4, 4))
    head = nn.Sequential(*layers).to(device=device, dtype=torch.float64)
    X, y = torch.zeros(3), torch.ones(3)
    X, y = X.to(device), y.to(x.device)
    return demo_model(0, device=device)
'''


def test_the_rule_flags_each_mistake_and_passes_the_fixes():
    bad = placement_findings(BAD, device_takers={"demo_model"})
    assert len(bad) == 5, "\n".join(bad)
    for text in ("MLP(...)", "torch.randn(...)", "nn.Linear(...)", "Conv(...)", "calls demo_model() without"):
        assert any(text in f for f in bad), (text, bad)
    assert placement_findings(GOOD, device_takers={"demo_model"}) == []


# --------------------------------------------------------------------------- at run time, on a device that is not the CPU
META = torch.device("meta")


def _devices(*things) -> set:
    out = set()
    for t in things:
        if isinstance(t, torch.nn.Module):
            out |= {p.device for p in t.parameters()} | {b.device for b in t.buffers()}
        elif torch.is_tensor(t):
            out.add(t.device)
        elif isinstance(t, (list, tuple)):
            out |= _devices(*t)
    return out


def _builders(device):
    from ddlcourse import federated, integrity
    from ddlcourse.experiments import model_parallel as model_parallel_exp, sharded as sharded_exp, tensor as tensor_exp

    cfg = integrity.make_config(batchnorm=True)
    kw = {} if device is None else {"device": device}
    return {
        "model_parallel_exp.demo_model": model_parallel_exp.demo_model(0, n_layers=3, **kw),
        "tensor_exp.serial_mlp": tensor_exp.serial_mlp(8, 16, **kw),
        "sharded_exp.make_model": sharded_exp.make_model(8, 16, 2, **kw),
        "federated._model": federated._model(0, 8, **kw),
        "federated.data": federated.data(16, 8, **kw),
        "integrity.build_model": integrity.build_model(cfg, **kw),
        "integrity.data": integrity.data(cfg, **kw),
        "integrity.augmentation_noise": integrity.augmentation_noise(cfg, [0, 3], 0, 0, "none", **kw),
    }


def test_builders_use_the_device_they_are_given():
    for name, built in _builders(META).items():
        assert _devices(built) == {META}, (name, _devices(built))


def test_builders_default_to_the_ranks_device(monkeypatch):
    """With no device given, the rank's device is used: patch what ``dist`` reports to a sentinel (meta)."""
    import dataclasses

    from ddlcourse import dist

    info = dist.DistInfo(rank=0, world_size=1, local_rank=0, device=META, backend="gloo", host="x", horovod=False)
    monkeypatch.setattr(dist, "init", lambda *a, **k: dataclasses.replace(info))
    monkeypatch.setattr(placement, "pick_device", lambda *a, **k: META)
    for name, built in _builders(None).items():
        assert _devices(built) == {META}, (name, _devices(built))


# --------------------------------------------------------------------------- an MPI rank without torch.distributed
@pytest.mark.mpi
def test_a_rank_without_torch_distributed_takes_its_local_ranks_gpu():
    """A parameter server's worker (notebook 09) or a search's trial (notebook 28) never starts torch.distributed:
    its device is still the GPU of its local rank, not local rank 0's (CUDA faked to show 4 GPUs). Under the
    venv's mpiexec the launcher names the local rank; in an srun step of 2 nodes of 2 tasks, SLURM_LOCALID does."""
    from ddlcourse.cluster import find_mpiexec

    out = run_ranks(4, "device_without_init").stdout.splitlines()
    assert out == ["cuda:0 cuda:1 cuda:2 cuda:3", "current device changed: False"], out
    cmd = [find_mpiexec(), "-bind-to", "none"]
    for r in range(4):                  # MPMD: each rank the Slurm variables of task r, 2 tasks per node
        cmd += [":"] if r else []
        cmd += ["-n", "1", "-env", "SLURM_PROCID", str(r), "-env", "SLURM_LOCALID", str(r % 2),
                "-env", "SLURM_STEP_NUM_TASKS", "4", *module_command("device_without_init")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines()[0] == "cuda:0 cuda:1 cuda:0 cuda:1", p.stdout


class _World:
    """An MPI world of 4 seen from rank 2, for placement's questions (no MPI here)."""

    def Get_rank(self):
        return 2

    def Get_size(self):
        return 4


def test_a_local_rank_nobody_named_is_refused_rather_than_asked_collectively(monkeypatch):
    """A trial runs on one engine alone: MPI's per-node split (collective) would wait for ranks that never come.
    Without a launcher variable and a split computed before, placement says so; one visible GPU needs no local
    rank, and a split computed before (MPICluster describes every engine when it starts) is used."""
    import torch

    for var in ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID", "DDLCOURSE_SHARE_GPUS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(placement, "_comm", _World)
    monkeypatch.setattr(placement, "_STATE", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(placement.LaunchError, match="not known without a collective call"):
        placement.pick_device(set_current=False, collective=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert str(placement.pick_device(set_current=False, collective=False)) == "cuda:0"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(placement, "_STATE", {"local_rank": 1})
    assert str(placement.pick_device(set_current=False, collective=False)) == "cuda:1"


# --------------------------------------------------------------------------- a lesson about CPU transports
@pytest.mark.mpi
def test_the_comm_hook_comparison_stays_on_cpu_tensors_on_a_gpu_rank():
    """Notebook 07 compares gloo and MPI as DDP's transports: on a GPU rank CUDA tensors would send every bucket
    through NCCL, whatever the hook. The rank's device is set to one that is not the CPU (meta); the comparison
    still trains on CPU tensors, and the MPI hooks carry every bucket."""
    out = run_ranks(2, "mpi_hook_compare_on_cpu").stdout
    assert "like serial: True" in out, out
    assert "MPI hooks' buckets through MPI: {'mpi': True, 'mpi-overlap': True}" in out, out
