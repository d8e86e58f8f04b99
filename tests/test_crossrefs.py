"""Every "notebook NN" in the course's prose names the notebook it means.

Notebooks get renumbered when material is added. A reference then silently points at the wrong
chapter ("notebook 06 (data parallelism)" after data parallelism moved to 05). The rule checked here:
every notebook a reference names exists, and the words around the reference (the same sentence, or the
parenthesis after it) name that notebook's topic, with one of the words listed in TOPICS. A renumbering
updates TOPICS once, and every stale reference then fails with its file, cell and text.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import NOTEBOOK_REF, notebook_numbers

ROOT = Path(__file__).resolve().parent.parent

# notebook number -> words any reference to it must have nearby (lower case; a word matches a prefix)
TOPICS: dict[str, tuple[str, ...]] = {
    # part 1: foundations
    "00": ("setup", "cluster", "mpicluster", "engine", "allreduce"),
    "01": ("sgd", "gradient descent", "stability", "epoch", "mini-batch"),
    "02": ("batch size", "learning rate", "learning-rate", "scaling rule", "warmup", "noise"),
    # part 2: data parallelism
    "03": ("loss integrity", "gradient averag", "gradient rule", "same answer", "1e-9", "global mean", "mistake"),
    "04": ("collective", "allreduce", "ring", "alpha-beta", "alpha–beta"),
    "05": ("data parallel", "data-parallel", "ddp", "horovod", "gradient hook"),
    "06": ("in practice", "no_sync", "accumulat", "find_unused", "unused parameter", "compression"),
    "07": ("runtime", "mpi", "nccl", "gloo", "grpc"),
    "08": ("hierarch", "node", "nvlink", "infiniband", "network", "topology"),
    "09": ("parameter server", "parameter-server", "staleness", "asynchronous"),
    "10": ("federated",),
    "11": ("batch norm", "batchnorm", "syncbatchnorm"),
    "12": ("large-batch", "large batch", "lars", "lamb", "shampoo", "soap", "optimizer"),
    "13": ("scaling", "speedup", "amdahl", "gustafson", "benchmark"),
    # part 3: beyond one device's memory
    "14": ("memory", "checkpointing"),
    "15": ("model parallel", "layers", "point-to-point", "send/recv"),
    "16": ("pipelin", "gpipe", "1f1b", "micro-batch", "bubble"),
    "17": ("schedule", "interleaved", "zero bubble", "zero-bubble", "pipelining"),
    "18": ("tensor", "spatial", "halo", "megatron", "column", "row-parallel"),
    "19": ("sharded", "sharding", "zero", "fsdp", "mesh"),
    # part 4: transformer-era parallelism
    "20": ("tensor", "sequence parallel", "megatron"),
    "21": ("context parallel", "ring attention", "long sequence"),
    "22": ("expert", "moe", "mixture"),
    # part 5: running at scale
    "23": ("mixed precision", "mixed-precision", "loss scal", "gradscaler", "fp16", "bf16"),
    "24": ("profil", "trace", "straggler", "timeline", "torch.compile"),
    "25": ("fault", "restart", "elastic", "survive"),
    "26": ("fsdp", "dcp", "checkpoint", "native sharding"),
    "27": ("data pipeline", "data loading", "i/o", "loader", "sharded on-disk"),
    "28": ("hyper-parameter", "hyperparameter", "search"),
    "29": ("performance model", "perfmodel", "scaling model", "what if"),
    "30": ("layout", "sizing", "calculator"),
}
STALE_NAMES = re.compile(r"Concepts\s+(?:I{1,3}|IV)\b")


def _prose_files() -> list[Path]:
    files = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("labs/*.ipynb"))
    files += sorted(ROOT.glob("slides/src/*.ipynb")) + [ROOT / "README.md", ROOT / "slides" / "README.md"]
    return [f for f in files if f.exists()]


def _texts(path: Path):
    """(where, text) of each markdown cell, or of the whole file for Markdown."""
    if path.suffix == ".md":
        yield path.name, path.read_text()
        return
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            yield f"{path.relative_to(ROOT)} cell {i}", "".join(cell["source"])


SENTENCE_END = re.compile(r"(?<!\bal)(?<!e\.g)(?<!i\.e)[.!?]\s|:\*\*\s|\||\n\s*\n")


def _context(text: str, start: int, end: int) -> str:
    """The sentence around a reference (its parenthesis included)."""
    ends = [m.end() for m in SENTENCE_END.finditer(text, 0, start)]
    left = ends[-1] if ends else 0
    m = SENTENCE_END.search(text, end)
    right = m.start() + 1 if m else len(text)
    return text[left:right].lower()


def _on_topic(nums: list[str], ctx: str) -> bool:
    """One or two notebooks: each one's topic is named. A longer span (11-13): some topic of it is."""
    named = [any(word in ctx for word in TOPICS[n]) for n in nums]
    return all(named) if len(nums) <= 2 else any(named)


def _existing() -> set[str]:
    return {p.name.split("_")[0] for p in ROOT.glob("notebooks/[0-9][0-9]*_*.ipynb")}


def test_topics_cover_exactly_the_notebooks():
    assert set(TOPICS) == _existing(), "update TOPICS when notebooks are added, removed or renumbered"


def _references():
    for path in _prose_files():
        for where, text in _texts(path):
            for m in NOTEBOOK_REF.finditer(text):
                yield where, text, m


def test_every_reference_names_an_existing_notebook_on_its_topic():
    existing, bad = _existing(), []
    for where, text, m in _references():
        nums = notebook_numbers(m.group(1), m.group(2) or "")
        missing = [n for n in nums if n not in existing]
        ctx = _context(text, m.start(), m.end())
        if missing:
            bad.append(f"{where}: '{m.group(0)}' names notebook(s) {missing} that do not exist")
        elif not _on_topic(nums, ctx):
            topics = "; ".join(f"{n}: {', '.join(TOPICS[n][:3])}" for n in nums)
            bad.append(f"{where}: '{m.group(0)}' in \"{ctx.strip()[:140]}\" does not mention its topic ({topics})")
    assert not bad, "stale notebook references:\n" + "\n".join(bad)


def test_no_names_of_parts_that_do_not_exist():
    bad = [f"{where}: {m.group(0)}" for path in _prose_files() for where, text in _texts(path)
           for m in STALE_NAMES.finditer(text)]
    assert not bad, "the course has no parts named like this:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, ok", [
    ("as notebook 05 (data parallelism) showed", True),
    ("as notebook 07 (data parallelism) showed", False),           # a stale reference (07 is the runtimes)
    ("**Assumes:** notebooks 04-05 (allreduce, DDP).", True),
    ("**Assumed:** notebooks 02–03 (allreduce, gradient averaging).", False),   # 02 is batch size
    ("Data parallelism at scale (notebooks 11–13: batch norm to speedup) copies the whole state.", True),
    ("see notebook 42 (anything)", False),
    ("**Assumes:** notebooks 05 (data parallel) and 09 (memory).", False),   # the second number missed a renumbering
])
def test_the_rule_catches_a_stale_number(text, ok):
    m = NOTEBOOK_REF.search(text)
    nums = notebook_numbers(m.group(1), m.group(2) or "")
    ctx = _context(text, m.start(), m.end())
    found = all(n in TOPICS for n in nums) and _on_topic(nums, ctx)
    assert found is ok
