"""Build the instructor's reveal.js decks from the course notebooks (one source, no drift).

    python -m instructor.slides build [--execute all|lectures|none] [--no-pdf] [DECK ...]     # or: make slides

A deck is a list of source notebooks: the concept notebooks and labs themselves, plus short slide notebooks
in ``slides/src/`` where a lecture needs more. From each source the build takes

* from the first cell tagged ``slide`` on, every cell except those tagged ``skip`` (untagged cells continue
  the slide before them, as in nbconvert), and every ``notes`` cell;
* if a notebook has no slide tags at all, every ``## `` section heading starts a slide, with the
  section's first figure.

Notebooks are executed first (at the ``smoke`` scale unless ``--scale`` says otherwise; cached by content
hash and scale in ``slides/build/executed``),
so the figures on the slides come from real runs. Every deck opens with a title slide carrying the
module's timing and speaker notes, and the speaker notes of the notebooks' own ``notes`` cells.
Decks are written to ``slides/decks/<name>.html`` and printed to ``slides/pdf/<name>.pdf`` by headless
Chromium (one page per slide). Everything a deck loads comes from ``slides/vendor`` (``make setup``).

A notebook section is often longer than a slide, so the build lays the deck out to fit the screen:

* long markdown cells are split at paragraph breaks into cells of their own;
* a code cell shows its input only when it is short (at most ``CODE_LINES`` lines) or tagged
  ``slides-code``; the tag ``slides-no-code`` hides any input. Outputs (figures, printed results) stay;
* the deck is opened in headless Chromium, every cell's height is measured, and a slide that would run
  past the bottom continues on a vertical subslide headed "<title> (continued)";
* what still does not fit (one very tall cell, a wide table) is shrunk in the browser by the deck's own
  script, to no less than ``MIN_FIT`` of its size. The browser test fails on any slide that overflows.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ddlcourse.config import SCALES

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
VENDOR = SLIDES / "vendor"
SLIDE_TYPES = ("slide", "subslide", "fragment", "notes", "-")


@dataclass
class Deck:
    name: str
    title: str
    minutes: int                     # in the half-day schedule
    sources: list[str]
    notes: str
    subtitle: str = ""
    full_day_minutes: int = 0

    def existing_sources(self) -> list[Path]:
        return [ROOT / s for s in self.sources if (ROOT / s).exists()]


DECKS: list[Deck] = [
    Deck("01_introduction", "Distributed Deep Learning on HPC", 20, ["slides/src/01_introduction.ipynb", "notebooks/00_setup_check.ipynb"],
         "Welcome. Goals for today; the four HPC attributes; the map of parallelism we will walk through. "
         "Ask who has a cluster account and who works on a laptop: the same notebooks serve both.",
         "Why distribute, and how", 30),
    Deck("02_foundations", "Part 1 · Foundations: SGD and batch size", 20,
         ["notebooks/01_sgd.ipynb", "notebooks/02_batch_size.ipynb"],
         "Start from gradient descent on a surface you can see, then what a bigger batch does to the learning "
         "rate, the warmup and the gradient noise.",
         "Notebooks 01–02", 45),
    Deck("03_data_parallel", "Part 2 · Data parallelism done right", 40,
         ["notebooks/03_loss_integrity.ipynb", "notebooks/04_collectives.ipynb", "notebooks/05_data_parallel.ipynb",
          "notebooks/06_data_parallel_in_practice.ipynb"],
         "The one rule first: the same global batch gives the same answer on 1 and N processes. Then collectives "
         "and their cost model, the five steps from serial to data-parallel three ways, your own DDP, and the "
         "practice around it: accumulation with no_sync, unused parameters, compression.",
         "Notebooks 03–06", 100),
    Deck("03b_runtimes", "Part 2 · What moves the bytes, and what allreduce replaced", 15,
         ["notebooks/07_comm_runtimes.ipynb", "notebooks/08_node_and_network.ipynb",
          "notebooks/09_parameter_server.ipynb", "notebooks/10_federated.ipynb"],
         "MPI, NCCL, Gloo, gRPC; gloo against MPI measured here; DDP communication hooks. The node and the "
         "network: the hierarchical allreduce, NVLink and InfiniBand on paper. Then the architecture allreduce "
         "replaced (parameter servers, staleness, local SGD) and federated averaging, which sends models.",
         "Notebooks 07–10", 60),
    Deck("03c_at_scale", "Part 2 · Batch norm, large batches and speedup", 20,
         ["notebooks/11_sync_batchnorm.ipynb", "notebooks/12_large_batch.ipynb", "notebooks/13_scaling.ipynb"],
         "SyncBatchNorm at small per-rank batches, large-batch optimizers, and how to measure speedup and "
         "efficiency honestly.",
         "Notebooks 11–13", 60),
    Deck("04_beyond_memory", "Part 3 · When the model does not fit", 40,
         ["notebooks/14_memory.ipynb", "notebooks/15_model_parallel.ipynb", "notebooks/16_pipeline.ipynb",
          "notebooks/17_pipeline_schedules.ipynb", "notebooks/18_tensor_spatial.ipynb",
          "notebooks/19_sharded_data_parallel.ipynb"],
         "Where memory goes; then each way to split a model, an image or the training state across devices, "
         "each checked against the serial model. Pipeline bubbles predicted and measured; ZeRO by hand.",
         "Notebooks 14–19", 100),
    Deck("05_transformer_parallel", "Part 4 · Parallelism for transformers: heads, sequence, context and experts", 20,
         ["notebooks/20_tensor_sequence_parallel.ipynb", "notebooks/21_context_parallel.ipynb",
          "notebooks/22_expert_parallel.ipynb"],
         "Split the heads and the MLP (Megatron's f and g) and the norms' tokens (sequence parallelism: an "
         "all-reduce taken apart, by hand and with DTensor), the sequence "
         "(ring attention, zig-zag against the causal imbalance) and the experts (all_to_all "
         "dispatch and combine, capacity and dropped tokens), each exact against the serial model.",
         "Notebooks 20–22", 45),
    Deck("05b_resilience", "Part 5 · Running at scale: precision, profiles, restarts, sharded checkpoints", 15,
         ["notebooks/23_mixed_precision.ipynb", "notebooks/24_profiling.ipynb", "notebooks/25_fault_tolerance.ipynb",
          "notebooks/26_native_sharding_checkpoints.ipynb"],
         "fp16 gradients that underflow and the loss scaler that brings them back; a profile of a DDP step, its "
         "straggler and its exposed allreduce. Then a rank killed on purpose: torchrun restarts the job and it "
         "resumes from the last checkpoint. Last, a DCP checkpoint saved on 2 ranks that 4 ranks load.",
         "Notebooks 23–26", 60),
    Deck("05c_io_search_models", "Part 5 · Feeding the accelerators, searching, predicting scale, sizing", 15,
         ["notebooks/27_data_pipeline.ipynb", "notebooks/28_hyperparameter_search.ipynb",
          "notebooks/29_perfmodel.ipynb", "notebooks/30_sizing_a_layout.ipynb"],
         "I/O that keeps the compute fed, hyper-parameter search as the other use of a cluster, a performance "
         "model to reason about thousands of GPUs we do not have in the room, and a layout calculator that "
         "chooses DP × TP × PP × CP for a 7B and a 70B model.",
         "Notebooks 27–30", 60),
    Deck("06_lab_maize", "Lab 1: maize segmentation and anomalies", 20, ["labs/01_maize.ipynb"],
         "Instance segmentation and anomaly detection, data-parallel with Horovod and DDP; SyncBatchNorm at "
         "small per-rank batches; weak scaling by growing the field.", "Lab 1", 45),
    Deck("07_lab_seismic", "Lab 2: 3D seismic facies", 20, ["labs/02_seismic.ipynb"],
         "2D sections stitch badly; 3D fixes it but hits the memory wall; spatial parallelism goes past it.",
         "Lab 2", 45),
    Deck("08_lab_topology", "Lab 3: topology optimization surrogate", 20, ["labs/03_topology.ipynb"],
         "A real SIMP solver makes the ground truth; a U-Net learns to skip the iterations; large-batch "
         "training with higher-order optimizers.", "Lab 3", 45),
    Deck("09_lab_driving", "Lab 4: traffic conflicts from multi-camera video", 20, ["labs/04_driving.ipynb"],
         "Video makes the largest inputs; model and pipeline parallelism across views and stages, "
         "combined with data parallelism.", "Lab 4", 45),
    Deck("10_wrapup", "Wrap-up", 10, ["slides/src/10_wrapup.ipynb"],
         "Recap the map, the rules of thumb, and where to go next. Collect feedback.", "What to take home", 15),
]


# --------------------------------------------------------------------------- selecting cells
def _slide_type(cell) -> str | None:
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type")


def select_cells(nb) -> list:
    """The cells of ``nb`` that go on slides (see the module docstring)."""
    cells = nb.cells
    tagged = any(_slide_type(c) in ("slide", "subslide") for c in cells)
    out, inside = [], False
    if tagged:
        for c in cells:
            t = _slide_type(c)
            if t == "skip":  # left out, without ending the section around it
                continue
            if t in ("slide", "subslide"):
                inside = True
            if inside or t == "notes":
                out.append(copy.deepcopy(c))
        return out
    # fallback: "## " headings start slides; keep the heading cell and the first figure of the section
    want_fig = False
    for c in cells:
        if c.cell_type == "markdown" and c.source.lstrip().startswith(("# ", "## ")):
            cc = copy.deepcopy(c)
            cc.metadata["slideshow"] = {"slide_type": "slide"}
            out.append(cc)
            want_fig = True
        elif want_fig and c.cell_type == "code" and any("image/png" in o.get("data", {}) for o in c.get("outputs", [])):
            cc = copy.deepcopy(c)
            cc.source = ""
            cc.metadata["slideshow"] = {"slide_type": "subslide"}
            cc.outputs = [o for o in cc.outputs if "image/png" in o.get("data", {})][:1]
            out.append(cc)
            want_fig = False
    return out


CODE_LINES = 12        # a code cell longer than this shows only its outputs on a slide (unless tagged)
MIN_FIT = 0.5          # the smallest font scale the deck's fit script may use (keep in step with the template)
_FENCE = ("```", "~~~")


def _tags(cell) -> set:
    return set(cell.get("metadata", {}).get("tags", []))


def _heading(cell) -> str | None:
    """The text of the first ``#``-heading of a markdown cell, if it opens with one."""
    if cell.cell_type != "markdown":
        return None
    first = cell.source.lstrip().split("\n", 1)[0]
    if first.startswith("#"):
        return first.lstrip("#").strip() or None
    return None


def split_markdown(cell) -> list:
    """Split a long markdown cell at its paragraph breaks (outside code fences, math and HTML blocks).

    A heading stays with the paragraph after it. The first piece keeps the cell's slide type; the others
    continue the slide (``-``), so the deck reads the same, but the layout can break between pieces.
    """
    src = cell.source
    if cell.cell_type != "markdown" or "<div" in src or "<details" in src or "<table" in src:
        return [cell]
    blocks, cur, fenced = [], [], False
    for line in src.split("\n"):
        if line.lstrip().startswith(_FENCE):
            fenced = not fenced
        if not line.strip() and not fenced and cur:
            blocks.append("\n".join(cur))
            cur = []
        elif line.strip() or cur:
            cur.append(line)
    if cur:
        blocks.append("\n".join(cur))
    blocks = [item for b in blocks for item in _list_items(b)]
    if len(blocks) < 2 or any(b.count("$$") % 2 for b in blocks):
        return [cell]
    merged = []
    for b in blocks:   # a heading or a lead-in ("...:") alone at the foot of a slide: glue it to what follows
        last = merged[-1].strip() if merged else ""
        if last and ((last.startswith("#") and "\n" not in last) or last.endswith(":")):
            merged[-1] = merged[-1] + "\n\n" + b
        else:
            merged.append(b)
    out = []
    for i, b in enumerate(merged):
        c = copy.deepcopy(cell)
        c.source = b
        if i:
            c.metadata["slideshow"] = {"slide_type": "-"}
        out.append(c)
    return out


def _is_item(line: str) -> bool:
    """A top-level list item: ``- x``, ``* x``, ``+ x`` or ``12. x`` at the start of the line."""
    head = line.split(" ", 1)[0]
    return bool(head) and line[:1] not in (" ", "\t") and " " in line and (
        head in ("-", "*", "+") or (head[:-1].isdigit() and head[-1:] in (".", ")")))


def _list_items(block: str) -> list[str]:
    """A markdown block cut before each top-level list item (a fenced block is never cut)."""
    if any(block.lstrip().startswith(f) for f in _FENCE):
        return [block]
    parts, cur = [], []
    for line in block.split("\n"):
        if _is_item(line) and cur:
            parts.append("\n".join(cur))
            cur = []
        cur.append(line)
    parts.append("\n".join(cur))
    return parts


OUTPUT_LINES = 24      # a printed output longer than this is cut on the slide (the notebook has it all)


def _cut(text: str, n: int = OUTPUT_LINES) -> str:
    lines = text.rstrip("\n").split("\n")
    if len(lines) <= n:
        return text
    return "\n".join(lines[:n]) + f"\n... ({len(lines) - n} more lines in the notebook)\n"


def slide_outputs(outputs: list) -> list:
    """Outputs as a slide shows them: no stderr (progress bars, warnings), long text cut."""
    out = []
    for o in outputs:
        o = copy.deepcopy(o)
        if o.get("output_type") == "stream":
            if o.get("name") == "stderr":
                continue
            o["text"] = _cut("".join(o.get("text", "")))
        elif "text/plain" in o.get("data", {}) and len(o["data"]) == 1:
            o["data"]["text/plain"] = _cut("".join(o["data"]["text/plain"]))
        out.append(o)
    return out


def prepare_cells(cells: list) -> list:
    """Split long markdown cells; hide long code inputs (see the module docstring); drop empty cells."""
    out = []
    for c in cells:
        if _slide_type(c) == "notes":
            out.append(c)
            continue
        if c.cell_type == "markdown":
            out.extend(split_markdown(c))
            continue
        if c.cell_type == "code":
            c.outputs = slide_outputs(c.get("outputs", []))
            tags = _tags(c)
            long = c.source.count("\n") + 1 > CODE_LINES
            if "slides-no-code" in tags or (long and "slides-code" not in tags):
                c.metadata.setdefault("transient", {})["remove_source"] = True
                if not c.get("outputs"):
                    if _slide_type(c) in ("slide", "subslide"):   # keep the slide break it carried
                        c.source, c.outputs = "", []
                    else:
                        continue
            elif c.get("outputs"):   # the code and its result as two cells, so a slide may break between them
                result = copy.deepcopy(c)
                result.metadata["transient"] = {"remove_source": True}
                result.metadata["slideshow"] = {"slide_type": "-"}
                result["id"] = f"{c.get('id') or 'cell'}-out"
                c.outputs = []
                out.extend([c, result])
                continue
        out.append(c)
    return out


def paginate(cells: list, heights: dict[str, float], budget: float) -> list:
    """Start a vertical subslide wherever the measured cells of a slide would pass ``budget`` pixels.

    ``heights`` maps cell ids to rendered heights (margins included). A cell that opens with a heading
    becomes the new subslide itself; any other cell gets a "<title> (continued)" heading before it.
    Returns the new list of cells (cells are copied; ids of inserted headings end in ``c``).
    """
    out, used, title = [], 0.0, None
    for c in cells:
        c = copy.deepcopy(c)
        t = _slide_type(c)
        if t == "notes":
            out.append(c)
            continue
        h = float(heights.get(c.get("id"), 0.0))
        head = _heading(c)
        if t == "slide":
            used, title = 0.0, head
        elif t == "subslide":
            used = 0.0
        elif used > 0 and used + h > budget:
            if head:
                c.metadata["slideshow"] = {"slide_type": "subslide"}
                used = 0.0
            else:
                cont = nbformat.v4.new_markdown_cell(f"### {title} (continued)" if title else "")
                cont.metadata["slideshow"] = {"slide_type": "subslide"}
                cont["id"] = f"{c.get('id', 'x')}c"
                out.append(cont)
                c.metadata["slideshow"] = {"slide_type": "-"}
                used = float(heights.get("_cont", 60.0)) if title else 0.0
        if head:
            title = head
        used += h
        out.append(c)
    return out


def title_cells(deck: Deck, scale: str = "smoke") -> list:
    head = nbformat.v4.new_markdown_cell(
        f"<div class='deck-title'>\n\n# {deck.title}\n\n### {deck.subtitle}\n\n"
        f"*Distributed Deep Learning on HPC* · {deck.minutes} min (half day) · {deck.full_day_minutes} min (full day)\n\n"
        f"<small>figures and numbers from runs at the `{scale}` scale</small>\n\n</div>")
    head.metadata["slideshow"] = {"slide_type": "slide"}
    notes = nbformat.v4.new_markdown_cell(deck.notes)
    notes.metadata["slideshow"] = {"slide_type": "notes"}
    return [head, notes]


def assemble(deck: Deck, executed: list, scale: str = "smoke") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = copy.deepcopy(executed[0].metadata) if executed else {}
    nb.cells = title_cells(deck, scale)
    for src in executed:
        nb.cells.extend(prepare_cells(select_cells(src)))
    for i, c in enumerate(nb.cells):
        c["id"] = f"s{i:04d}"
        if c.cell_type == "code":
            c.metadata.setdefault("slideshow", {})
    return nb


def count_slides(nb, kinds: tuple | str = ("slide", "subslide")) -> int:
    """Slides reveal.js will show: horizontal slides plus vertical subslides (or only ``kinds``)."""
    kinds = (kinds,) if isinstance(kinds, str) else kinds
    return sum(1 for c in nb.cells if _slide_type(c) in kinds)


# --------------------------------------------------------------------------- executing sources
def _hash_file(p: Path) -> str:
    pkg = sorted((ROOT / "ddlcourse").rglob("*.py"))
    h = hashlib.sha256(p.read_bytes())
    for f in pkg:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def executed_copy(path: Path, execute: bool = True, timeout: int = 3600, scale: str = "smoke") -> nbformat.NotebookNode:
    """The notebook after running it at ``scale`` (cached by the hash of it, of the package, and the scale)."""
    nb = nbformat.read(path, as_version=4)
    if not execute:
        return nb
    if not nb.cells:
        raise ValueError(f"{path} has no cells")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    tag = "" if scale == "smoke" else f"-{scale}"
    cache = SLIDES / "build" / "executed" / f"{path.stem}{tag}-{_hash_file(path)}.ipynb"
    if cache.exists():
        return nbformat.read(cache, as_version=4)
    from nbclient import NotebookClient
    # smoke scale, and the inline backend so that figures become outputs (tests set MPLBACKEND=Agg)
    saved = {k: os.environ.get(k) for k in ("DDLCOURSE_SCALE", "MPLBACKEND", "PYTHONPATH")}
    os.environ.update(DDLCOURSE_SCALE=scale, MPLBACKEND="module://matplotlib_inline.backend_inline",
                      PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]])))   # instructor.figures
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cache.parent.mkdir(parents=True, exist_ok=True)
    for old in cache.parent.glob(f"{path.stem}{tag}-*.ipynb"):
        if old.stem[len(path.stem + tag) + 1:].isalnum():   # this scale's older copies only
            old.unlink()
    nbformat.write(nb, cache)
    return nb


# --------------------------------------------------------------------------- exporting
def export_html(nb, out: Path) -> None:
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    if not (VENDOR / "reveal.js" / "dist" / "reveal.js").exists():
        raise FileNotFoundError(f"{VENDOR}/reveal.js is missing: run 'make setup' (it installs the slide assets with npm)")
    c = Config()
    c.SlidesExporter.reveal_url_prefix = "../vendor/reveal.js"
    c.SlidesExporter.require_js_url = "../vendor/require.js"
    c.SlidesExporter.reveal_theme = "white"
    c.SlidesExporter.reveal_transition = "none"
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.exclude_input_prompt = True
    c.SlidesExporter.exclude_output_prompt = True
    exp = SlidesExporter(config=c, template_name="ddlreveal", extra_template_basedirs=[str(SLIDES / "template")])
    html, _ = exp.from_notebook_node(nb)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)


@dataclass
class Built:
    name: str
    html: Path
    slides: int
    pdf: Path | None = None
    pdf_pages: int = -1
    sources: list[str] = field(default_factory=list)
    main_slides: int = 0     # horizontal slides: the main line of the talk


def _should_execute(path: Path, execute: str) -> bool:
    if execute not in ("all", "lectures", "none"):
        raise ValueError(f"execute must be 'all', 'lectures' or 'none', got {execute!r}")
    return execute == "all" or (execute == "lectures" and path.is_relative_to(SLIDES))


_MEASURE_JS = """(() => {
  const out = {};
  ddlLeafSections().forEach(s => ddlWithShown(s, () => {
    s.querySelectorAll('.jp-Cell').forEach(c => {
      const cs = getComputedStyle(c);
      out[c.id.replace('cell-id=', '')] = c.offsetHeight + parseFloat(cs.marginTop) + parseFloat(cs.marginBottom);
    });
  }));
  const probe = document.createElement('h3'); probe.textContent = 'A title (continued)';
  const s0 = ddlLeafSections()[0]; ddlWithShown(s0, () => { s0.appendChild(probe);
    const cs = getComputedStyle(probe);
    out._cont = probe.offsetHeight + parseFloat(cs.marginTop) + parseFloat(cs.marginBottom); probe.remove(); });
  return JSON.stringify({cells: out, height: Reveal.getConfig().height});
})()"""


def measure(chrome, url: str) -> tuple[dict, float]:
    """Rendered height of every cell of a deck (opened with its fit script off), and the height budget."""
    rep = chrome.open(url.split("?")[0] + "?measure")
    if not rep.ready:
        raise RuntimeError(f"reveal.js did not start for {url}: cannot lay the deck out")
    m = json.loads(chrome.eval(_MEASURE_JS))
    return m["cells"], 0.94 * float(m["height"]) - 24.0   # the section's padding, and a little air


def build(names: list[str] | None = None, execute: str = "all", pdf: bool = True, log=print,
          scale: str = "smoke") -> list[Built]:
    """Build decks. ``execute``: ``all`` sources, only the ``lectures`` in slides/src, or ``none``;
    executed at ``scale`` (``laptop`` gives figures from real-size runs, at about an hour per build).

    With Chromium on the machine (``env/install_chromium.sh``) every deck is laid out to fit its slides
    and printed to PDF; without it, decks are written unpaginated and ``pdf=True`` fails.
    """
    from contextlib import ExitStack

    from instructor.browser import Chromium, StaticServer, find_chromium

    decks = [d for d in DECKS if not names or d.name in names]
    unknown = set(names or []) - {d.name for d in DECKS}
    if unknown:
        raise ValueError(f"unknown deck(s) {sorted(unknown)}; decks: {', '.join(d.name for d in DECKS)}")
    built = []
    with ExitStack() as stack:
        chrome = url = None
        if find_chromium():
            url = stack.enter_context(StaticServer(SLIDES))
            chrome = stack.enter_context(Chromium())
        elif pdf:
            raise FileNotFoundError("no Chromium to lay out and print the decks: run env/install_chromium.sh "
                                    "(make slides does), or build with --no-pdf")
        else:
            log("no Chromium: decks are written without fitting long sections to slides")
        for d in decks:
            t0 = time.perf_counter()
            srcs = d.existing_sources()
            executed = [executed_copy(p, _should_execute(p, execute), scale=scale) for p in srcs]
            nb = assemble(d, executed, scale)
            html = SLIDES / "decks" / f"{d.name}.html"
            export_html(nb, html)
            if chrome is not None:
                heights, budget = measure(chrome, f"{url}/decks/{d.name}.html")
                nb.cells = paginate(nb.cells, heights, budget)
                export_html(nb, html)
            b = Built(d.name, html, count_slides(nb), sources=[str(p.relative_to(ROOT)) for p in srcs],
                      main_slides=count_slides(nb, "slide"))
            built.append(b)
            log(f"{d.name}: {b.slides} slides ({b.main_slides} across, the rest continue below them) "
                f"from {len(srcs)} source(s) in {time.perf_counter() - t0:.1f} s")
        if pdf:
            (SLIDES / "pdf").mkdir(exist_ok=True)
            for b in built:
                b.pdf = SLIDES / "pdf" / f"{b.name}.pdf"
                b.pdf_pages = chrome.print_pdf(f"{url}/decks/{b.name}.html", b.pdf)
                log(f"{b.name}: PDF with {b.pdf_pages} pages")
                if b.pdf_pages != b.slides:
                    raise RuntimeError(f"{b.name}: the PDF has {b.pdf_pages} pages for {b.slides} slides")
    manifest = SLIDES / "decks" / "manifest.json"
    manifest.write_text(json.dumps([{"name": b.name, "scale": scale, "slides": b.slides, "main_slides": b.main_slides,
                                     "pdf_pages": b.pdf_pages,
                                     "sources": b.sources} for b in built], indent=1))
    return built


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instructor.slides")
    p.add_argument("action", choices=["build", "list"])
    p.add_argument("decks", nargs="*")
    p.add_argument("--execute", choices=["all", "lectures", "none"], default="all",
                   help="which sources to run first for their figures (default all, at the smoke scale)")
    p.add_argument("--scale", default="smoke", choices=SCALES, help="the scale the notebooks run at for their figures "
                   "(smoke, the default, takes about 10 min; laptop about an hour)")
    p.add_argument("--no-pdf", action="store_true")
    a = p.parse_args(argv)
    if a.action == "list":
        for d in DECKS:
            print(f"{d.name:<22} {d.minutes:>3} min  {', '.join(d.sources)}")
        return 0
    t0 = time.perf_counter()
    build(a.decks or None, execute=a.execute, pdf=not a.no_pdf, scale=a.scale)
    print(f"built in {time.perf_counter() - t0:.1f} s -> slides/decks/, slides/pdf/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
