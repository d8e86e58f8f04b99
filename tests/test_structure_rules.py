"""Structural rules over the package's source (AST), checked without a GPU, in the manner of test_device_placement.

Three mistakes that a CPU-only CI never sees, each found by reading the code:

1. **Point-to-point goes through ``torch.distributed.batch_isend_irecv``.** A function of ``ddlcourse/`` that
   *calls* torch.distributed's ``isend``/``irecv``/``send``/``recv`` itself violates the rule when it calls
   both a sending (``isend``, ``send``) and a receiving (``irecv``, ``recv``) one, or calls one of them inside
   a loop (``for``, ``while``, a comprehension). Nested functions count with the function that defines them
   (a ``send``/``recv`` pair of closures is one exchange). Naming ``tdist.isend`` inside ``tdist.P2POp(...)``
   is not a call, so a batched exchange, or a helper that batches (``context._sendrecv``), passes. Why: under
   NCCL the messages between two ranks travel in the order they are posted on one stream, and a send waits
   for its receive; when every rank of a ring posts ``isend`` to the next and then ``irecv`` from the previous
   as separate calls, every rank waits in its send and the ring deadlocks. ``batch_isend_irecv`` posts the
   sends and receives of a rank as one group. Exceptions: :data:`P2P_ALLOWED`, each with its reason.
2. **No checkpoint or shared file in a temporary folder.** ``tempfile`` (``mkdtemp``, ``mkstemp``,
   ``TemporaryDirectory``, ``NamedTemporaryFile``, ``gettempdir``, ...) and ``"/tmp..."`` string literals
   (docstrings aside) are flagged in every function of ``ddlcourse/`` and in the code cells of the notebooks
   and labs: each node has its own /tmp, so a rank on another node finds nothing there. Checkpoints and files
   that ranks read go to ``ddlcourse.training.run_dir(name)`` (the shared results path). Exceptions:
   :data:`TEMP_ALLOWED` (a private file that never crosses nodes), each with its reason.
3. **A timer of device work waits for the device.** A function that reads the host clock
   (``time.perf_counter``, ``time.time``, ``time.monotonic``, their ``_ns`` forms) and also does torch work
   (names ``torch``/``torch.distributed``/``nn``/``F`` of its module's imports, or calls ``.backward()``,
   ``.to(...)``, ``.cuda()``) is flagged, unless each read is the statement right after a
   ``...synchronize(...)`` call: CUDA runs kernels asynchronously, so the clock must be read after a
   synchronisation, i.e. through ``ddlcourse.device.now(device)``, ``RunContext.now``/``ctx.timer()`` or CUDA
   events. Exceptions: :data:`HOST_TIMERS` (the course's clocks themselves, host-only timers such as cluster
   start-up, file I/O and NumPy work, each with its reason).

Each rule has a test that it fails on the code it was written against (the old ring attention, the old 12e).

Two rules over the tests themselves, each shown to catch planted examples:

4. **A script the tests run is a module.** Code that runs on MPI ranks (or in a ``python`` of its own) lives in
   ``tests/ranks/`` and runs by name (``helpers.run_ranks``, ``helpers.module_command``), where linters see it
   and its traceback names its file and line; no string of more than one line of Python reaches a runner
   (``run_mpi``, a subprocess, ``[..., "-c", code]``). Exceptions: :data:`SCRIPTS_ALLOWED`, each with its
   reason. Every script of ``tests/ranks/`` is run by some test.
5. **One helper module.** A test module imports what tests share from ``tests/helpers.py``, never from another
   test module or from ``conftest.py``; a rank script imports nothing of ``tests/`` but ``tests.ranks``.
   Exceptions: :data:`IMPORTS_ALLOWED`.
"""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from helpers import top_level_functions

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(p.relative_to(ROOT).as_posix() for d in ("ddlcourse", "instructor") for p in (ROOT / d).rglob("*.py"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


# --------------------------------------------------------------------------- reading the code
def _dotted(node: ast.AST) -> str | None:
    """``torch.distributed.isend`` -> "torch.distributed.isend"; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


def _imports(tree: ast.Module) -> dict[str, str]:
    """``{local name: the dotted module or object it stands for}`` from the module's imports."""
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                out[a.asname or a.name] = f"{n.module}.{a.name}"
    return out


def _resolve(node: ast.AST, names: dict[str, str]) -> str | None:
    """The dotted name a call's function stands for: ``tdist.isend`` -> "torch.distributed.isend"."""
    d = _dotted(node)
    if d is None:
        return None
    head, _, rest = d.partition(".")
    if head in names:
        return names[head] + ("." + rest if rest else "")
    return d


def _calls(fn, names):
    """``(call node, dotted name of what it calls, inside a loop?)`` for every call in ``fn``'s body."""
    loops = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

    def walk(node, in_loop):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.Call):
                yield ch, _resolve(ch.func, names), in_loop
            yield from walk(ch, in_loop or isinstance(ch, loops))

    yield from walk(fn, False)


# --------------------------------------------------------------------------- rule 1: point-to-point
P2P = "torch.distributed."
SENDS, RECVS = {"isend", "send"}, {"irecv", "recv"}

# (module, function) -> why its separate sends and receives cannot wait on each other round a cycle.
P2P_ALLOWED = {
    ("ddlcourse/parallel/model_parallel.py", "send_tensor"):
        "one direction only (a stage to the next): a header then the tensor, to one peer, never a cycle",
    ("ddlcourse/parallel/model_parallel.py", "recv_tensor"):
        "one direction only: the header then the tensor from one peer; its sender never waits on this rank",
    ("ddlcourse/parallel/branches.py", "BranchParallel._learners_head_step"):
        "lab 4's learner-written head step receives send/recv callbacks: a star round the head rank (features "
        "in, gradients out), no ring",
    ("ddlcourse/parallel/branches.py", "BranchParallel.step"):
        "a star round the head rank, and each pair posts in one order: a branch sends all its micro-batches' "
        "features, then receives their gradients; the head receives every feature before it sends a gradient",
    ("ddlcourse/cases/driving.py", "_logits_mp"):
        "forward only, a gather onto the head rank: branch ranks only send, the head only receives",
    ("ddlcourse/exercises/wrong.py", "_plant"):
        "a planted mistake on purpose: a message whose dtype does not fit its receive, which the checkers must name "
        "(only ever run on simulated ranks: the rehearsal stops it before any real rank sees it)",
}


def p2p_findings(source: str, module: str = "<source>") -> list[str]:
    """Every violation of rule 1 in ``source``."""
    tree = ast.parse(source)
    names = _imports(tree)
    found = []
    for name, fn in top_level_functions(tree):
        if (module, name) in P2P_ALLOWED:
            continue
        sends, recvs, looped = [], [], []
        for call, what, in_loop in _calls(fn, names):
            if not (what and what.startswith(P2P)) or what[len(P2P):] not in SENDS | RECVS:
                continue
            op = what[len(P2P):]
            (sends if op in SENDS else recvs).append(f"{op}@{call.lineno}")
            if in_loop:
                looped.append(f"{op}@{call.lineno}")
        if sends and recvs:
            found.append(f"{module}: {name}() calls {', '.join(sends)} and {', '.join(recvs)} separately: put "
                         "them in one torch.distributed.batch_isend_irecv")
        elif looped:
            found.append(f"{module}: {name}() calls {', '.join(looped)} in a loop: batch them with "
                         "torch.distributed.batch_isend_irecv")
    return found


@pytest.mark.parametrize("module", MODULES)
def test_point_to_point_is_batched(module):
    findings = p2p_findings((ROOT / module).read_text(), module)
    assert not findings, "\n".join(findings)


def _git_show(rev_path: str) -> str:
    p = subprocess.run(["git", "show", rev_path], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"git show {rev_path}: {p.stderr.strip()[:200]} (a shallow clone?)")
    return p.stdout


def test_the_p2p_rule_sees_the_old_ring_attention():
    """Before 70cc63e, ring attention's K/V shift posted isend then irecv as two calls (``_sendrecv``)."""
    old = _git_show("70cc63e~1:ddlcourse/parallel/context.py")
    bad = p2p_findings(old, "ddlcourse/parallel/context.py")
    assert any("_sendrecv()" in f and "isend@" in f and "irecv@" in f for f in bad), bad
    assert p2p_findings((ROOT / "ddlcourse/parallel/context.py").read_text(), "ddlcourse/parallel/context.py") == []


P2P_BAD = '''
import torch.distributed as tdist
from torch import distributed as dist2

def shift(x, nxt, prv):
    out = x.clone()
    reqs = [tdist.isend(x, nxt), tdist.irecv(out, prv)]
    return out

def ring(blocks, n, r):
    for b in blocks:
        dist2.send(b, (r + 1) % n)

def pair_of_closures(x, peer):
    def send(t):
        tdist.isend(t, peer)
    def recv(t):
        tdist.recv(t, peer)
    send(x); recv(x)
'''
P2P_GOOD = '''
import torch.distributed as tdist

def shift(x, nxt, prv):
    out = x.clone()
    for q in tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, x, nxt), tdist.P2POp(tdist.irecv, out, prv)]):
        q.wait()
    return out

def one_way(x, peer):
    tdist.send(x, peer)

def other_way(x, peer):
    tdist.recv(x, peer)

def uses_the_helper(xs, nxt, prv):
    return [shift(x, nxt, prv) for x in xs]
'''


def test_the_p2p_rule_flags_each_mistake_and_passes_the_fixes():
    bad = p2p_findings(P2P_BAD)
    assert [f.split("()")[0] for f in bad] == ["<source>: shift", "<source>: ring", "<source>: pair_of_closures"], bad
    assert p2p_findings(P2P_GOOD) == []


# --------------------------------------------------------------------------- rule 2: temporary folders
TEMP_CALLS = {"mkdtemp", "mkstemp", "mktemp", "TemporaryDirectory", "NamedTemporaryFile", "TemporaryFile",
              "SpooledTemporaryFile", "gettempdir", "gettempdirb"}

# (module, function) -> why the temporary path never holds a checkpoint or a file another node reads.
TEMP_ALLOWED = {
    ("ddlcourse/cluster/mpicluster.py", "MPICluster._start_once"):
        "the cluster's ipyparallel profile folder: mkdtemp(dir=runtime_dir()) only makes a unique name under the "
        "course's runtime folder (the home or test root), never in the node's /tmp",
    ("ddlcourse/cluster/forkserver.py", "shared"):
        "a fork server's socket and log: mkdtemp(dir=parent_dir) only makes a unique name in the folder its caller "
        "names (the course's runtime folder for engines), and the socket serves ranks of this host only",
    ("ddlcourse/datapipe.py", "scratch_dir"):
        "mkdtemp(dir=root) only makes a unique name under the data cache root, which the learner points at a "
        "file system",
    ("instructor/browser.py", "Chromium.__enter__"):
        "headless Chromium's own profile for the slide checks, on the instructor's machine, one process",
    ("ddlcourse/exercises/rehearsal.py", "rehearse"):
        "the simulated ranks' socket and logs: mkdtemp(dir=runtime_dir()) only makes a unique name under the "
        "course's runtime folder, and the ranks are processes of this host, gone when the rehearsal ends",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _temp_uses(node: ast.AST, names: dict[str, str], docs: set[int]) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            what = _resolve(n.func, names) or ""
            if what.startswith("tempfile.") and what.split(".", 1)[1] in TEMP_CALLS:
                out.append(f"{what}()@{n.lineno}")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value == "/tmp" or n.value.startswith("/tmp/"):
                out.append(f"{n.value!r}@{n.lineno}")
    return out


def temp_findings(source: str, module: str = "<source>") -> list[str]:
    """Every violation of rule 2 in a module's ``source`` (its functions and its module-level code)."""
    tree = ast.parse(source)
    names, docs = _imports(tree), _docstrings(tree)
    found = []
    for name, fn in top_level_functions(tree):
        uses = _temp_uses(fn, names, docs)
        if uses and (module, name) not in TEMP_ALLOWED:
            found.append(f"{module}: {name}() uses {', '.join(uses)}: use training.run_dir(name)")
    top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    uses = [u for n in top for u in _temp_uses(n, names, docs)]
    if uses:
        found.append(f"{module}: module level uses {', '.join(uses)}")
    return found


def _code_cells(nb: dict) -> list[tuple[int, str]]:
    return [(i, "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
            for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def notebook_temp_findings(nb: dict, name: str = "<notebook>") -> list[str]:
    """Rule 2 on a notebook's code cells (IPython magics dropped; a cell that does not parse: by its text)."""
    found = []
    for i, src in _code_cells(nb):
        py = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(py)
        except SyntaxError:
            if "tempfile" in src or "/tmp" in src:
                found.append(f"{name} cell {i}: tempfile or /tmp in a cell that does not parse")
            continue
        names = _imports(tree)
        names.setdefault("tempfile", "tempfile")      # imported in an earlier cell
        uses = _temp_uses(tree, names, _docstrings(tree))
        if uses:
            found.append(f"{name} cell {i} uses {', '.join(uses)}: use training.run_dir(name)")
    return found


@pytest.mark.parametrize("module", MODULES)
def test_no_shared_file_in_a_temporary_folder(module):
    findings = temp_findings((ROOT / module).read_text(), module)
    assert not findings, "\n".join(findings)


def test_no_notebook_writes_to_a_temporary_folder():
    findings = [f for nb in NOTEBOOKS for f in notebook_temp_findings(json.loads(nb.read_text()), nb.name)]
    assert not findings, "\n".join(findings)


def test_every_temp_exception_is_still_used():
    """An allowed entry whose function no longer uses a temporary path is dropped (it would hide a new one)."""
    for module, name in TEMP_ALLOWED:
        tree = ast.parse((ROOT / module).read_text())
        fns = dict(top_level_functions(tree))
        assert name in fns, f"{module}: no function {name}"
        assert _temp_uses(fns[name], _imports(tree), _docstrings(tree)), f"{module}:{name} uses no temporary path"


def test_the_temp_rule_sees_the_old_12e():
    """Before 73e2b19, notebook 26 (then 12e) saved its DCP checkpoint to ``tempfile.mkdtemp()`` on the notebook's node."""
    old = json.loads(_git_show("00672ac:notebooks/12e_native_sharding_checkpoints.ipynb"))
    bad = notebook_temp_findings(old, "12e")
    assert any("tempfile.mkdtemp()" in f for f in bad), bad


TEMP_BAD = '''
import tempfile
from tempfile import TemporaryDirectory as TD

def save(state):
    d = tempfile.mkdtemp(prefix="ckpt-")
    with TD() as e:
        pass
    return open("/tmp/shared.pt", "wb"), tempfile.gettempdir()
'''
TEMP_GOOD = '''
from ddlcourse import training

def save(state):
    """Never into /tmp: each node has its own."""
    d = training.run_dir("ckpt")
    return d / "state.pt"
'''


def test_the_temp_rule_flags_each_mistake_and_passes_the_fix():
    bad = temp_findings(TEMP_BAD)
    assert len(bad) == 1, bad
    for text in ("tempfile.mkdtemp()", "tempfile.TemporaryDirectory()", "'/tmp/shared.pt'", "tempfile.gettempdir()"):
        assert text in bad[0], (text, bad)
    assert temp_findings(TEMP_GOOD) == []


# --------------------------------------------------------------------------- rule 3: timers of device work
CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns"}
TORCH = ("torch",)                   # torch, torch.distributed, torch.nn, torch.nn.functional, ...
DEVICE_METHODS = {"backward", "to", "cuda"}

# (module, function) -> why its host clock is right (it synchronises first, or it times no device work).
HOST_TIMERS = {
    ("ddlcourse/device.py", "now"): "the course's synchronising clock itself: synchronize(device), then the clock",
    ("ddlcourse/elastic.py", "train_loop"):
        "wall-clock timestamps in the run's log, taken after float(mean) has waited for the step's allreduce; "
        "restart_seconds spans two processes (a killed attempt and its restart), which only the wall clock can",
    ("ddlcourse/perfmodel.py", "measure_compute"):
        "times SmallCNN's forward and backward on this CPU (one thread), the compute figure of the model",
    ("ddlcourse/runtimes.py", "compare_gloo_mpi"):
        "gloo against MPI_Allreduce on CPU tensors (the same host memory as the NumPy buffer); no device",
}


def _lines_after_a_synchronize(fn) -> set[int]:
    """Lines of the statements that directly follow a ``...synchronize(...)`` statement in the same block."""
    out = set()
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for prev, st in zip(block, block[1:]):
                if isinstance(prev, ast.Expr) and isinstance(prev.value, ast.Call) \
                        and (_dotted(prev.value.func) or "").endswith("synchronize"):
                    out |= set(range(st.lineno, (st.end_lineno or st.lineno) + 1))
    return out


def timer_findings(source: str, module: str = "<source>") -> list[str]:
    """Every violation of rule 3 in ``source``."""
    tree = ast.parse(source)
    names = _imports(tree)
    torch_names = {k for k, v in names.items() if v.split(".")[0] in TORCH}
    found = []
    for name, fn in top_level_functions(tree):
        if (module, name) in HOST_TIMERS:
            continue
        after_sync = _lines_after_a_synchronize(fn)
        clocks = [f"time.{what.split('.')[1]}()@{call.lineno}" for call, what, _ in _calls(fn, names)
                  if what and what.startswith("time.") and what.split(".")[1] in CLOCKS and what.count(".") == 1
                  and call.lineno not in after_sync]
        if not clocks:
            continue
        torch_work = any(isinstance(n, ast.Name) and n.id in torch_names for n in ast.walk(fn)) or any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in DEVICE_METHODS
            for n in ast.walk(fn))
        if torch_work:
            found.append(f"{module}: {name}() reads {', '.join(clocks)} and runs torch work: time it with "
                         "ddlcourse.device.now(device) (or ctx.timer())")
    return found


def test_the_timer_rule_sees_a_clock_around_device_work():
    bad = '''
import time
import torch

def step(model, x):
    t0 = time.perf_counter()
    model(x).sum().backward()
    return time.perf_counter() - t0
'''
    good = '''
import time
from ddlcourse.device import now

def step(model, x, device):
    t0 = now(device)
    model(x).sum().backward()
    return now(device) - t0

def host_only(path):
    t0 = time.perf_counter()
    path.read_bytes()
    return time.perf_counter() - t0
'''
    assert len(timer_findings(bad)) == 1 and "time.perf_counter()@6" in timer_findings(bad)[0]
    assert timer_findings(good) == []


@pytest.mark.parametrize("module", MODULES)
def test_timers_of_device_work_synchronise(module):
    findings = timer_findings((ROOT / module).read_text(), module)
    assert not findings, "\n".join(findings)


def test_every_exception_names_a_function_that_exists():
    for table in (P2P_ALLOWED, HOST_TIMERS):
        for module, name in table:
            fns = dict(top_level_functions(ast.parse((ROOT / module).read_text())))
            assert name in fns, f"{module}: no function {name} (an exception for a function that is gone)"


# --------------------------------------------------------------------------- notebook 17: chunk timing without a sync per chunk
class _FakeStage:
    stage_index = 3

    def __init__(self, log):
        self.log = log
        self.forward_one_chunk = lambda mb: log.append(("F", mb))
        self.backward_one_chunk = lambda mb: log.append(("B", mb))
        self.backward_weight_one_chunk = lambda mb: log.append(("W", mb))


def _run_chunks(clock, events):
    from ddlcourse.experiments import pipeline_schedules as pipeline_schedules_exp
    log = []
    stage = _FakeStage(log)
    pipeline_schedules_exp._instrument(stage, events, 0, clock)
    t0 = clock.start_step()
    stage.forward_one_chunk(0)
    stage.backward_one_chunk(0)
    stage.backward_weight_one_chunk(0)
    return t0, log


def test_chunk_timing_on_cuda_records_events_and_synchronises_once(monkeypatch):
    """With a fake CUDA: every chunk gets an event pair, the device is synchronised only at the step's start
    (after the barrier) and end, and the events are read only after that end."""
    import torch

    from ddlcourse.experiments import pipeline_schedules as pipeline_schedules_exp
    gpu = {"t": 0.0, "synced_at": -1.0, "syncs": 0}

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self, stream=None):
            gpu["t"] += 1.5                           # the GPU's own clock moves on, in ms
            self.at = gpu["t"]

        def elapsed_time(self, other):
            assert gpu["synced_at"] >= max(self.at, other.at), "an event was read before the step's synchronize"
            return other.at - self.at

    def sync(device=None):
        gpu["syncs"] += 1
        gpu["synced_at"] = gpu["t"]

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    clock = pipeline_schedules_exp._ChunkClock("cuda:0")
    events = []
    t0, log = _run_chunks(clock, events)
    assert log == [("F", 0), ("B", 0), ("W", 0)]
    assert gpu["syncs"] == 1                          # the step's start only: none around the chunks
    assert all(isinstance(e["start"], FakeEvent) and isinstance(e["stop"], FakeEvent) for e in events)
    clock.end_step()
    assert gpu["syncs"] == 2
    got = pipeline_schedules_exp._resolve(events, clock, t0)
    assert [(e["kind"], e["stage"]) for e in got] == [("F", 3), ("B", 3), ("W", 3)]
    assert [(round(e["start"], 6), round(e["stop"], 6)) for e in got] == \
        [(0.0015, 0.003), (0.0045, 0.006), (0.0075, 0.009)]   # ms after the reference event, in seconds


def test_chunk_timing_on_the_cpu_is_the_host_clock(monkeypatch):
    import torch

    from ddlcourse.experiments import pipeline_schedules as pipeline_schedules_exp

    def no_events(*a, **k):
        raise AssertionError("no CUDA event on the CPU")

    monkeypatch.setattr(torch.cuda, "Event", no_events)
    clock = pipeline_schedules_exp._ChunkClock("cpu")
    events = []
    t0, _ = _run_chunks(clock, events)
    clock.end_step()
    assert all(isinstance(e["start"], float) and t0 <= e["start"] <= e["stop"] for e in events)
    got = pipeline_schedules_exp._resolve(events, clock, t0)
    assert all(g["start"] == e["start"] - t0 and g["stop"] == e["stop"] - t0 for g, e in zip(got, events))


def test_measure_reads_the_events_after_the_step():
    """measure(): the clock's start_step/end_step bracket the step and _resolve comes after end_step."""
    import inspect

    from ddlcourse.experiments import pipeline_schedules as pipeline_schedules_exp
    src = inspect.getsource(pipeline_schedules_exp.measure)
    a = src.index("clock.start_step()")
    assert a < src.index("_step(sched", a) < src.index("clock.end_step()", a) < src.index("_resolve(events, clock, t0)", a)
    assert "synchronize" not in inspect.getsource(pipeline_schedules_exp._instrument)


# --------------------------------------------------------------------------- one clock
def cuda_synchronize_calls(tree: ast.AST) -> list[int]:
    """Lines that call ``torch.cuda.synchronize`` (or ``cuda.synchronize``) directly."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "synchronize"
            and isinstance(n.func.value, (ast.Attribute, ast.Name))
            and (getattr(n.func.value, "attr", None) == "cuda" or getattr(n.func.value, "id", None) == "cuda")]


def test_only_the_device_module_waits_for_cuda():
    """One clock (issue 28): ``ddlcourse.device.now`` / ``synchronize``; every other timer calls them."""
    bad = {m: lines for m in MODULES if m != "ddlcourse/device.py"
           and (lines := cuda_synchronize_calls(ast.parse((ROOT / m).read_text())))}
    assert not bad, f"call ddlcourse.device.synchronize / now instead of torch.cuda.synchronize: {bad}"


def test_the_clock_rule_sees_a_private_clock():
    src = "import time, torch\ndef clock(d):\n    if d.type == 'cuda':\n        torch.cuda.synchronize(d)\n    return time.perf_counter()\n"
    assert cuda_synchronize_calls(ast.parse(src)) == [4]


# --------------------------------------------------------------------------- one saved-tensor meter
def saved_tensor_hook_calls(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "saved_tensors_hooks"]


def test_only_memory_registers_saved_tensor_hooks():
    """One meter (issue 28): ``memory.SavedTensors`` counts what autograd saves, with one rule for everyone."""
    bad = {m: lines for m in MODULES if m != "ddlcourse/memory.py"
           and (lines := saved_tensor_hook_calls(ast.parse((ROOT / m).read_text())))}
    assert not bad, f"measure with ddlcourse.memory.SavedTensors instead of your own saved_tensors_hooks: {bad}"


def test_the_meter_rule_sees_a_private_meter():
    src = "import torch\nwith torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):\n    pass\n"
    assert saved_tensor_hook_calls(ast.parse(src)) == [2]


# --------------------------------------------------------------------------- one builder of process groups
GROUP_CALLS = {"new_group", "new_subgroups", "init_device_mesh", "from_group", "DeviceMesh", "Split", "Create_group"}
GROUPS_HOME = "ddlcourse/grid.py"
GROUPS_ALLOWED = {
    "ddlcourse/exercises/": "the learners' reference solutions build their own Split by design (the exercise)",
}
GROUPS_PENDING = {   # to be switched to ddlcourse.grid (issue 28); remove an entry once its module has no such call
}


def group_calls(tree: ast.AST) -> list[int]:
    """Lines that make a process group, a DeviceMesh or an MPI communicator: ``x.new_group(...)``,
    ``init_device_mesh(...)``, ``DeviceMesh.from_group(...)``, ``comm.Split(...)``, ``world.Create_group(...)``...
    (``Split_type``, which only asks MPI which ranks share a host, is not one of them)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in GROUP_CALLS:
                out.append(n.lineno)
    return sorted(out)


def _group_exception(module: str) -> bool:
    return any(module.startswith(p) for p in (*GROUPS_ALLOWED, *GROUPS_PENDING))


def test_process_groups_are_made_only_by_the_grid():
    """One builder (issue 28): every torch group, DeviceMesh and MPI communicator comes from ``ddlcourse.grid``
    (``grid.build(...)``, ``group_of``, ``comm_of``, ``device_mesh_of``), which makes each once and caches it."""
    bad = {m: lines for m in MODULES if m.startswith("ddlcourse/") and m != GROUPS_HOME and not _group_exception(m)
           and (lines := group_calls(ast.parse((ROOT / m).read_text())))}
    assert not bad, f"make process groups with ddlcourse.grid (build / group_of / comm_of / device_mesh_of): {bad}"


def test_every_group_exception_is_still_needed():
    for prefix in (*GROUPS_ALLOWED, *GROUPS_PENDING):
        users = [m for m in MODULES if m.startswith(prefix) and group_calls(ast.parse((ROOT / m).read_text()))]
        assert users, f"{prefix} makes no process group any more: remove it from the exceptions"


def test_the_group_rule_sees_a_private_builder():
    src = ("import torch.distributed as tdist\nfrom torch.distributed.device_mesh import init_device_mesh\n"
           "def mesh(dp, tp, comm):\n    rows = [tdist.new_group([i * tp + j for j in range(tp)]) for i in range(dp)]\n"
           "    m = init_device_mesh('cpu', (dp, tp))\n    local = comm.Split(comm.rank // tp, comm.rank)\n"
           "    host = comm.Split_type(0)\n    return rows, m, local, host, comm.Get_group()\n")
    assert group_calls(ast.parse(src)) == [4, 5, 6]


# --------------------------------------------------------------------------- the tests' own code: scripts are modules
TESTS = ROOT / "tests"
RANKS = TESTS / "ranks"
# What runs code it is given: the runners of tests/helpers.py and conftest's fixtures, a subprocess, a fork-server
# rank; a function of the scanned module that hands one of its parameters to one of these is one too.
RUNNER_CALLS = {"run_mpi", "mpi", "on_ranks", "check_on_ranks", "Popen", "check_output", "check_call", "system",
                "rank_command", "execv", "execvp"}
RUNNER_DOTTED = {"subprocess.run", "subprocess.call"}
MAX_SCRIPT_LINES = 1          # a one-line ``python -c`` may stay a string

# (test file, function) -> why a script of more than one line still reaches a runner as a string there.
SCRIPTS_ALLOWED = {
    ("test_forkserver.py", "test_exit_status_and_traceback_reach_mpiexec"):
        "tests run_mpi's -c path itself: the traceback of a two-line -c script names <string>, line 2",
    ("test_gpu_smoke.py", "_call"):
        "runs one bash function cut from env/gpu_smoke.sh's own text, so the test checks the script as it is",
}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _scope_chain(node: ast.AST, parents: dict) -> list[ast.AST]:
    """The functions around ``node``, innermost first, then the module."""
    out = []
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            out.append(node)
    return out


def _is_script(text: str | None) -> int:
    """How many lines the Python script ``text`` has (0 if it is not one): it parses, with format fields
    (``{ckpt!r}``) read as names."""
    if not text:
        return 0
    import re
    import textwrap

    text = textwrap.dedent(text)
    lines = sum(1 for line in text.splitlines() if line.strip())
    for candidate in (text, re.sub(r"\{[^{}\n]*\}", "_", text)):
        try:
            ast.parse(candidate)
            return lines
        except (SyntaxError, ValueError):
            pass
    return 0


def scripts_in_strings(source: str, module: str = "<test>") -> list[str]:
    """Every script of more than :data:`MAX_SCRIPT_LINES` lines that reaches a runner (:data:`RUNNER_CALLS`, a
    ``[..., "-c", code]`` list) as a string built in ``source``: a literal, an f-string, a concatenation, a
    ``.format``/``.replace``/``dedent`` of one, or a name bound to any of these in the same function or at module
    level. One finding per string, at the line where it starts."""
    tree = ast.parse(source)
    parents = _parents(tree)
    bound: dict[tuple[ast.AST, str], list[ast.AST]] = {}     # (scope, name) -> the values assigned to it there
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    bound.setdefault((_scope_chain(n, parents)[0], t.id), []).append(n.value)

    def texts(node, depth=0) -> list[tuple[str, int]]:
        """``(text, line where it starts)`` of each string ``node`` may stand for (placeholders for values)."""
        if depth > 20:
            return []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value, node.lineno)]
        if isinstance(node, ast.JoinedStr):
            return [("".join(v.value if isinstance(v, ast.Constant) else "_" for v in node.values), node.lineno)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = texts(node.left, depth + 1), texts(node.right, depth + 1)
            if not left and not right:
                return []
            return [(a + b, (la or lb)) for a, la in left or [("", 0)] for b, lb in right or [("", 0)]]
        if isinstance(node, ast.Name):
            for scope in _scope_chain(node, parents):
                if (scope, node.id) in bound:
                    return [t for v in bound[(scope, node.id)] for t in texts(v, depth + 1)]
            return []
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("format", "replace", "strip", "lstrip", "rstrip"):
                return texts(f.value, depth + 1)
            if (_dotted(f) or "").split(".")[-1] == "dedent" and node.args:
                return texts(node.args[0], depth + 1)
        return []

    def strings(node):
        """The outermost expressions under ``node`` that stand for strings."""
        if isinstance(node, ast.expr) and texts(node):
            yield node
        else:
            for child in ast.iter_child_nodes(node):
                yield from strings(child)

    runners = set(RUNNER_CALLS)

    def runner_arguments(root):
        for n in ast.walk(root):
            if isinstance(n, ast.Call):
                d = _dotted(n.func) or ""
                if d in RUNNER_DOTTED or d.split(".")[-1] in runners:
                    yield n, d, [*n.args, *(k.value for k in n.keywords)]
            elif isinstance(n, (ast.List, ast.Tuple)) and any(isinstance(e, ast.Constant) and e.value == "-c"
                                                              for e in n.elts):
                yield n, '[..., "-c", ...]', n.elts

    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    grown = True
    while grown:                       # a function that hands a parameter of its own to a runner is a runner
        grown = False
        for fn in functions:
            params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
            if fn.name not in runners and any(isinstance(x, ast.Name) and x.id in params
                                               for _, _, args in runner_arguments(fn) for a in args
                                               for x in ast.walk(a)):
                runners.add(fn.name)
                grown = True
    found = {}
    for node, runner, args in runner_arguments(tree):
        where = next((s.name for s in _scope_chain(node, parents) if isinstance(s, ast.FunctionDef)), "<module>")
        if (module, where) in SCRIPTS_ALLOWED:
            continue
        for sub in (s for a in args for s in strings(a)):
            for text, line in texts(sub):
                lines = _is_script(text)
                if lines > MAX_SCRIPT_LINES and (line, where) not in found:
                    found[(line, where)] = (f"{module}:{line} {where}(): a {lines}-line script in a string reaches "
                                            f"{runner}(...) at line {node.lineno}: make it a module of tests/ranks/ "
                                            "(helpers.run_ranks, helpers.module_command)")
    return [found[k] for k in sorted(found)]


def _test_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(TESTS.glob("*.py"))}


def test_no_test_module_holds_a_script_in_a_string():
    """A script that runs on MPI ranks (or in a process of its own) is a module of tests/ranks/: linted, with a
    traceback that names its file and line."""
    bad = [f for name, src in _test_sources().items() for f in scripts_in_strings(src, name)]
    assert not bad, "\n".join(bad)


def test_every_script_exception_is_still_needed():
    sources = _test_sources()
    for module, function in list(SCRIPTS_ALLOWED):
        kept = SCRIPTS_ALLOWED.pop((module, function))
        try:
            assert any(f" {function}(): " in f for f in scripts_in_strings(sources[module], module)), \
                f"{module}:{function} runs no script from a string any more: remove it from SCRIPTS_ALLOWED"
        finally:
            SCRIPTS_ALLOWED[(module, function)] = kept


SCRIPTS_PLANTED = '''
import subprocess, sys, textwrap
import pytest
from helpers import run_mpi, run_ranks

CODE = r"""
import torch
from ddlcourse import dist
dist.init()
"""
PHASE = """
ckpt = {ckpt!r}
print("SAVED", ckpt)
"""
PLANTED_FOR_A_RULE = """
import torch
def train(device=None):
    return torch.randn(3)
"""
EXPECTED = """
RANK 0 M 1 TOTAL 0.9
RANK 1 M 1 TOTAL 0.9
"""


def _run(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env)


def test_module_level(mpi):
    mpi(2, CODE)


def test_formatted(tmp_path):
    run_mpi(2, PHASE.format(ckpt=str(tmp_path)))


def test_fstring_and_wrapper(tmp_path):
    code = f"""
from ddlcourse import datapipe
print(datapipe.read_contention({str(tmp_path)!r}))
"""
    _run(code, {})


def test_concatenated(on_ranks):
    on_ranks(3, "import torch\\n" + "v = run_checker('x', None)\\nassert v.ok\\n")


def test_dedented():
    script = textwrap.dedent("""
        import os
        os.kill(os.getpid(), 9)
    """)
    subprocess.run([sys.executable, "-c", script])


def test_fine(mpi, tmp_path):
    """A docstring of
    several lines."""
    mpi(2, "import sys; sys.exit(bench(['--steps', '1']))")          # a one-liner
    run_ranks(2, "amp_dp_mixed_precision", tmp_path)                # a module
    assert "RANK 0" in EXPECTED and rule_findings(PLANTED_FOR_A_RULE) == []   # data, not run
    subprocess.run(["sh", "-c", "echo one\\necho two"])              # not Python
'''


def test_the_script_rule_finds_planted_scripts():
    """Each way a script reached a runner as a string before tests/ranks/ is found, once, where the string starts;
    a one-liner, a module run by name, a docstring, expected output and a planted example for a rule are not."""
    bad = scripts_in_strings(SCRIPTS_PLANTED, "test_planted.py")
    got = [(f.split()[0], f.split()[1], f.split(" reaches ")[1].split("(...)")[0]) for f in bad]
    assert got == [("test_planted.py:6", "test_module_level():", "mpi"),
                   ("test_planted.py:11", "test_formatted():", "run_mpi"),
                   ("test_planted.py:39", "test_fstring_and_wrapper():", "_run"),
                   ("test_planted.py:47", "test_concatenated():", "on_ranks"),
                   ("test_planted.py:51", "test_dedented():", "subprocess.run")], bad


# --------------------------------------------------------------------------- the tests' own code: one helper module
# A test module imports what tests share from tests/helpers.py, never from another test module or from conftest.py
# (pytest loads conftest itself, for its hooks and fixtures). A script of tests/ranks/ runs outside pytest: it
# imports neither of them, nor helpers.
# test file -> why it still imports another test module.
IMPORTS_ALLOWED: dict = {}


def imported_test_modules(source: str, rank_script: bool = False) -> list[str]:
    """``"line: module"`` for each import, anywhere in ``source``, of a test module (``test_*``) or of conftest;
    in a rank script (``rank_script``) of helpers too."""
    banned = ("conftest", "helpers") if rank_script else ("conftest",)
    out = []
    for n in ast.walk(ast.parse(source)):
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module] if isinstance(n, ast.ImportFrom) and n.module and not n.level else []
        for name in names:
            top = name.split(".")[0]
            if top.startswith("test_") or top in banned:
                out.append(f"{n.lineno}: {name}")
    return out


def test_test_modules_import_no_other_test_module():
    bad = [f"tests/{name}:{line}" for name, src in _test_sources().items() if name not in IMPORTS_ALLOWED
           for line in imported_test_modules(src)]
    bad += [f"tests/ranks/{p.name}:{line}" for p in sorted(RANKS.glob("*.py"))
            for line in imported_test_modules(p.read_text(), rank_script=True)]
    assert not bad, "import what tests share from tests/helpers.py (and nothing of tests/ in tests/ranks/):\n" + \
        "\n".join(bad)


def test_every_import_exception_is_still_needed():
    sources = _test_sources()
    for name in IMPORTS_ALLOWED:
        assert imported_test_modules(sources[name]), f"{name} imports no test module: remove it from IMPORTS_ALLOWED"


def test_the_import_rule_finds_planted_imports():
    planted = ("from __future__ import annotations\nimport json\nfrom test_crossrefs import REF, _numbers\n"
               "import test_driving as td\nfrom helpers import run_ranks\nfrom ddlcourse.exercises import test_x\n"
               "def f():\n    from conftest import run_mpi\n    import conftest\n")
    assert imported_test_modules(planted) == ["3: test_crossrefs", "4: test_driving", "8: conftest", "9: conftest"]
    script = ("import json\nfrom helpers import RANKS\nfrom tests.ranks._on_ranks import finish\n"
              "from . import _on_ranks\n")
    assert imported_test_modules(script) == []
    assert imported_test_modules(script, rank_script=True) == ["2: helpers"]


def _rank_scripts() -> list[str]:
    return sorted(p.stem for p in RANKS.glob("*.py") if not p.name.startswith("_"))


def test_every_rank_script_is_run_by_a_test():
    """A script of tests/ranks/ is named (a string constant) by some test module; none is named ``test_*``, which
    pytest would collect and so run inside its own process."""
    named = {n.value for src in _test_sources().values() for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    scripts = _rank_scripts()
    assert scripts, "no script in tests/ranks/"
    assert not [s for s in scripts if s.startswith("test_")], "a rank script named test_*: pytest would collect it"
    unused = [s for s in scripts if s not in named and f"{s}.py" not in named]
    assert not unused, f"scripts of tests/ranks/ that no test runs: {unused}"
