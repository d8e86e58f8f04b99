"""The talk decks: slides/talk/<deck>.md, written for presenting, built into reveal.js decks.

    python -m instructor.slides build [DECK ...]        # or: make slides

Format (the full contract is in slides/README.md): front matter (``title``, ``minutes``, ``notebooks``)
between ``---`` lines, then slides separated by a line ``---``. A slide opens with ``## Claim`` (a content
slide) or ``### Section`` (a divider). Everything after a line ``Note:`` is the speaker notes. Images:
``![caption](diagram:NAME?k=v)`` (a function of instructor/diagrams) and
``![caption](notebook:notebooks/NN_x.ipynb#CELL_ID)`` (the first image output of that cell, executed at the
build's scale).

This module parses decks and measures them (words, figures, notes) without a browser; the rules the decks
keep are here too (``check_deck``) so the unit test, the build and the browser test agree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

ROOT = Path(__file__).resolve().parent.parent
TALK = ROOT / "slides" / "talk"
AGENDA = ROOT / "slides" / "AGENDA.md"

MAX_WORDS = 40               # words on a content slide outside code, notes, title and captions
SHARE_SHORT = 0.9            # share of content slides that must keep to MAX_WORDS
SHARE_FIGURES = 0.5          # share of content slides that must show a figure or diagram
SLIDES_PER_HOUR = 30         # content slides per hour of the deck's slot, at most
CODE_LINES = 12              # a fenced block longer than this belongs in the notebook

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Image:
    caption: str
    url: str

    @property
    def kind(self) -> str:
        """``diagram``, ``notebook`` or ``file``."""
        head = self.url.split(":", 1)[0]
        return head if head in ("diagram", "notebook") else "file"

    @property
    def target(self) -> str:
        """The diagram's name, or the notebook's path (relative to the repository root)."""
        rest = self.url.split(":", 1)[1] if self.kind != "file" else self.url
        return rest.split("?", 1)[0].split("#", 1)[0]

    @property
    def cell(self) -> str:
        """The cell id of a notebook reference."""
        return self.url.split("#", 1)[1] if "#" in self.url else ""

    @property
    def params(self) -> dict:
        """Keyword arguments of a diagram reference, as int, float or str."""
        if "?" not in self.url:
            return {}
        return {k: _number(v) for k, v in parse_qsl(self.url.split("?", 1)[1], keep_blank_values=True)}


def _number(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


@dataclass
class Slide:
    title: str
    level: int                  # 2: a content slide; 3: a section divider; 0: no heading (an error for the rules)
    body: str                   # the markdown under the title, notes excluded
    notes: str = ""
    line: int = 0               # where the slide starts in the file (1-based), for messages
    images: list[Image] = field(default_factory=list)
    code: list[str] = field(default_factory=list)    # the fenced blocks' contents

    @property
    def content(self) -> bool:
        return self.level != 3

    @property
    def has_figure(self) -> bool:
        return bool(self.images)


@dataclass
class Deck:
    name: str
    path: Path
    title: str
    minutes: int
    notebooks: list[str]
    slides: list[Slide]
    meta: dict = field(default_factory=dict)

    @property
    def content_slides(self) -> list[Slide]:
        return [s for s in self.slides if s.content]

    def notebook_paths(self) -> list[str]:
        """The notebooks it presents, as paths: ``03`` -> notebooks/03_*.ipynb, ``lab 2`` -> labs/02_*.ipynb."""
        out = []
        for n in self.notebooks:
            m = re.fullmatch(r"(lab\s*)?(\d+)", n.strip(), re.I)
            if not m:
                out.append(n.strip())
                continue
            folder = "labs" if m.group(1) else "notebooks"
            hits = sorted((ROOT / folder).glob(f"{int(m.group(2)):02d}_*.ipynb"))
            out.append(str(hits[0].relative_to(ROOT)) if hits else f"{folder}/{int(m.group(2)):02d}_?.ipynb")
        return out


def split_front_matter(text: str) -> tuple[dict, str, int]:
    """(front matter as a dict of strings, the rest, the line the rest starts on)."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise ValueError("a deck starts with front matter between two '---' lines")
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            meta = {}
            for ln in lines[1:i]:
                ln = ln.split(" #", 1)[0].rstrip()
                if ln.strip() and ":" in ln:
                    k, v = ln.split(":", 1)
                    meta[k.strip()] = v.strip()
            return meta, "\n".join(lines[i + 1:]), i + 2
    raise ValueError("the front matter has no closing '---'")


def parse_slide(chunk: str, line: int = 0) -> Slide:
    lines = chunk.strip("\n").split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
        line += 1
    title, level = "", 0
    if lines and re.match(r"^#{2,3} ", lines[0]):
        level = len(lines[0]) - len(lines[0].lstrip("#"))
        title = lines[0][level:].strip()
        lines = lines[1:]
    body, notes, fenced, code, cur = [], [], False, [], None
    target = body
    for ln in lines:
        if _FENCE.match(ln):
            fenced = not fenced
            if fenced:
                cur = []
            else:
                code.append("\n".join(cur))
                cur = None
        elif fenced and cur is not None:
            cur.append(ln)
        if not fenced and target is body and re.match(r"^Note:\s*", ln):
            target = notes
            ln = re.sub(r"^Note:\s*", "", ln)
            if not ln:
                continue
        target.append(ln)
    text = "\n".join(body).strip("\n")
    return Slide(title, level, text, "\n".join(notes).strip(), line,
                 [Image(c, u) for c, u in _IMAGE.findall(_strip_code(text))], code)


def _strip_code(md: str) -> str:
    """Markdown without its fenced blocks and inline code."""
    out, fenced = [], False
    for ln in md.split("\n"):
        if _FENCE.match(ln):
            fenced = not fenced
            continue
        if not fenced:
            out.append(ln)
    return re.sub(r"`[^`]*`", " ", "\n".join(out))


def parse_text(text: str, name: str = "deck", path: Path | None = None) -> Deck:
    meta, rest, first = split_front_matter(text)
    chunks, cur, start, fenced = [], [], first, False
    for i, ln in enumerate(rest.split("\n")):
        if _FENCE.match(ln):
            fenced = not fenced
        if ln.strip() == "---" and not fenced:
            chunks.append((start, "\n".join(cur)))
            cur, start = [], first + i + 1
        else:
            cur.append(ln)
    chunks.append((start, "\n".join(cur)))
    slides = [parse_slide(c, ln) for ln, c in chunks if c.strip()]
    try:
        minutes = int(meta.get("minutes", "0"))
    except ValueError:
        raise ValueError(f"{name}: minutes must be a whole number, got {meta.get('minutes')!r}") from None
    nbs = [n.strip() for n in meta.get("notebooks", "").split(",") if n.strip()]
    return Deck(name, path or Path(f"{name}.md"), meta.get("title", name), minutes, nbs, slides, meta)


def parse_deck(path: Path | str) -> Deck:
    path = Path(path)
    return parse_text(path.read_text(encoding="utf-8"), path.stem, path)


def deck_files() -> list[Path]:
    """Every deck, in the order of the course (file names sort that way)."""
    return sorted(TALK.glob("*.md"))


def load_decks(names: list[str] | None = None) -> list[Deck]:
    decks = [parse_deck(p) for p in deck_files()]
    if names:
        unknown = set(names) - {d.name for d in decks}
        if unknown:
            raise ValueError(f"unknown deck(s) {sorted(unknown)}; decks: {', '.join(d.name for d in decks)}")
        decks = [d for d in decks if d.name in names]
    return decks


# --------------------------------------------------------------------------- measures
def visible_text(slide: Slide) -> str:
    """The body's text as the audience reads it: no code, no images (captions are small print), no markup."""
    t = _strip_code(slide.body)
    t = _IMAGE.sub(" ", t)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)          # links keep their text
    t = re.sub(r"<[^>]+>", " ", t)                          # inline HTML tags
    t = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$", " x ", t, flags=re.S)   # a formula reads as one word
    return t


def words(slide: Slide) -> int:
    """Words on a slide outside code, notes, its title and figure captions (a word has a letter or digit)."""
    return sum(1 for w in visible_text(slide).split() if re.search(r"\w", w))


@dataclass
class Measures:
    content: int
    short: float            # share of content slides with <= MAX_WORDS words
    figures: float          # share of content slides with a figure or diagram
    notes: float            # share of content slides with notes
    minutes: int

    @property
    def per_hour(self) -> float:
        return 60.0 * self.content / self.minutes if self.minutes else float("inf")


def measure(deck: Deck) -> Measures:
    cs = deck.content_slides
    n = len(cs) or 1
    return Measures(len(cs), sum(words(s) <= MAX_WORDS for s in cs) / n, sum(s.has_figure for s in cs) / n,
                    sum(bool(s.notes.strip()) for s in cs) / n, deck.minutes)


def check_deck(deck: Deck, render_diagrams: bool = False) -> list[str]:
    """Every rule the deck breaks, as messages (empty: the deck is fine). ``render_diagrams`` also draws each."""
    problems = []
    where = lambda s: f"{deck.name}:{s.line} '{s.title[:50]}'"   # noqa: E731
    m = measure(deck)
    if not deck.content_slides:
        problems.append(f"{deck.name}: no content slides")
    if deck.minutes <= 0:
        problems.append(f"{deck.name}: front matter needs 'minutes: N' (its agenda slot)")
    if "title" not in deck.meta:
        problems.append(f"{deck.name}: front matter needs a title")
    if m.short < SHARE_SHORT:
        long = [f"{where(s)} ({words(s)} words)" for s in deck.content_slides if words(s) > MAX_WORDS]
        problems.append(f"{deck.name}: only {m.short:.0%} of content slides keep to {MAX_WORDS} words "
                        f"(need {SHARE_SHORT:.0%}): {long}")
    if m.figures < SHARE_FIGURES:
        problems.append(f"{deck.name}: only {m.figures:.0%} of content slides show a figure (need {SHARE_FIGURES:.0%})")
    for s in deck.content_slides:
        if s.level == 0:
            problems.append(f"{where(s)}: a slide starts with '## Claim' or '### Section'")
        if not s.notes.strip():
            problems.append(f"{where(s)}: no speaker notes ('Note:')")
        for c in s.code:
            if c.count("\n") + 1 > CODE_LINES:
                problems.append(f"{where(s)}: a code block of {c.count(chr(10)) + 1} lines (at most {CODE_LINES}; "
                                "link the notebook instead)")
    if deck.minutes > 0 and m.per_hour > SLIDES_PER_HOUR:
        problems.append(f"{deck.name}: {m.content} content slides in {deck.minutes} min is {m.per_hour:.0f} per hour "
                        f"(at most {SLIDES_PER_HOUR})")
    problems += check_references(deck, render_diagrams)
    return problems


def check_references(deck: Deck, render_diagrams: bool = False) -> list[str]:
    """Every diagram reference names a registered diagram (and draws, if asked); every notebook reference
    names an existing notebook and cell id; every plain image file exists."""
    from instructor import diagrams

    out = []
    for s in deck.slides:
        for im in s.images:
            tag = f"{deck.name}:{s.line} '{s.title[:50]}'"
            if im.kind == "diagram":
                if im.target not in diagrams.DIAGRAMS:
                    out.append(f"{tag}: no diagram named {im.target!r}")
                elif render_diagrams:
                    try:
                        fig = diagrams.render(im.target, **im.params)
                        fig.clf()
                    except Exception as e:   # the message names the slide; the traceback is not needed here
                        out.append(f"{tag}: diagram {im.target!r} fails: {type(e).__name__}: {e}")
            elif im.kind == "notebook":
                nb = ROOT / im.target
                if not nb.exists():
                    out.append(f"{tag}: no notebook {im.target}")
                elif im.cell not in notebook_cell_ids(nb):
                    out.append(f"{tag}: {im.target} has no cell with id {im.cell!r}")
            elif not (deck.path.parent / im.target).exists():
                out.append(f"{tag}: no image file {im.target}")
    return out


def notebook_cell_ids(path: Path) -> set[str]:
    import json
    return {c.get("id", "") for c in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]}


# --------------------------------------------------------------------------- the agenda
@dataclass
class Row:
    start: str
    minutes: int
    kind: str                # deck, demo, lab, break
    what: str

    @property
    def deck(self) -> str | None:
        m = re.match(r"\s*`([^`]+)`", self.what)
        return m.group(1) if self.kind == "deck" and m else None


@dataclass
class Plan:
    key: str                 # "half", "full": the heading's first word, lower case
    heading: str
    start: str
    end: str
    rows: list[Row]

    @property
    def length(self) -> int:
        return _clock(self.end) - _clock(self.start)


def _clock(hhmm: str) -> int:
    h, m = hhmm.strip().split(":")
    return 60 * int(h) + int(m)


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _table_rows(lines: list[str]) -> list[list[str]]:
    rows = []
    for ln in lines:
        if ln.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", ln.strip()):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows[1:]       # the header row


def parse_agenda(text: str) -> tuple[dict[str, Plan], dict[str, int]]:
    """The plans (``## Half day (13:00-17:00)`` + a table start | minutes | kind | what) and the run time in
    minutes of each notebook (the ``## What runs live`` table)."""
    plans, runtimes = {}, {}
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for sec in sections:
        heading, *lines = sec.split("\n")
        m = re.search(r"\((\d{1,2}:\d\d)\s*-\s*(\d{1,2}:\d\d)\)", heading)
        rows = _table_rows(lines)
        if m:
            key = heading.split()[0].lower()
            plans[key] = Plan(key, heading.strip(), m.group(1), m.group(2),
                              [Row(r[0], int(r[1]), r[2], r[3] if len(r) > 3 else "") for r in rows])
        elif rows and rows[0][0].endswith(".ipynb"):
            runtimes = {r[0]: int(r[1]) for r in rows}
    return plans, runtimes


def check_agenda(text: str, decks: list[Deck], runtimes: dict[str, int] | None = None) -> list[str]:
    """The plans add up (rows chain from the start to the end), each deck's row has the deck's minutes, a deck that
    no plan presents is named under ``## The self-paced path``, and the run-time table agrees with the notebooks'
    headers (``runtimes``). The hands-on blocks keep rules of their own (:mod:`instructor.handson`)."""
    plans, table = parse_agenda(text)
    out = []
    if not plans:
        out.append("AGENDA.md has no plan ('## Half day (13:00-17:00)' with a table)")
    minutes = {d.name: d.minutes for d in decks}
    for p in plans.values():
        t = _clock(p.start)
        for r in p.rows:
            if _clock(r.start) != t:
                out.append(f"{p.heading}: the row '{r.what or r.kind}' starts at {r.start}, the row before ends at {_hhmm(t)}")
            t = _clock(r.start) + r.minutes
            if r.kind == "deck":
                if r.deck is None:
                    out.append(f"{p.heading}: a deck row names no deck in backticks: {r.what!r}")
                elif r.deck not in minutes:
                    out.append(f"{p.heading}: no deck {r.deck} in slides/talk")
                elif minutes[r.deck] != r.minutes:
                    out.append(f"{p.heading}: {r.deck} has {r.minutes} min here, {minutes[r.deck]} in its front matter")
        total = sum(r.minutes for r in p.rows)
        if total != p.length:
            out.append(f"{p.heading}: the rows add up to {total} min, the plan is {p.length} min")
    paced = re.search(r"^## The self-paced path\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    missing = set(minutes) - {r.deck for p in plans.values() for r in p.rows} - set(
        re.findall(r"`(\w+)`", paced.group(1) if paced else ""))
    if missing:
        out.append(f"the decks {sorted(missing)} are in no plan and not on the self-paced path")
    if runtimes is not None:
        for nb, m in runtimes.items():
            if table.get(nb) != m:
                out.append(f"AGENDA.md gives {nb} {table.get(nb)} min at laptop scale, its header says {m}")
    return out


def header_runtimes() -> dict[str, int]:
    """Minutes at laptop scale from each notebook's header ("about M minutes at laptop scale (measured on ...")."""
    import json
    out = {}
    for p in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb")):
        head = "".join("".join(c["source"]) for c in json.loads(p.read_text(encoding="utf-8"))["cells"][:3])
        m = re.search(r"about (\d+) minutes? at laptop scale", head)
        if m:
            out[str(p.relative_to(ROOT))] = int(m.group(1))
    return out


# --------------------------------------------------------------------------- rendering
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.S)


def markdown_html(md: str) -> str:
    """Markdown to HTML (tables, strikethrough); math is left as ``$...$`` text for KaTeX in the browser."""
    import html

    import mistune

    keep = []

    def hold(m):
        keep.append(html.escape(m.group(0)))
        return f"MATHSPAN{len(keep) - 1}Z"

    out, fenced = [], False
    for ln in md.split("\n"):
        if _FENCE.match(ln):
            fenced = not fenced
        out.append(ln if fenced else _MATH.sub(hold, ln))
    text = mistune.create_markdown(escape=False, plugins=["table", "strikethrough"])("\n".join(out))
    return re.sub(r"MATHSPAN(\d+)Z", lambda m: keep[int(m.group(1))], text)


def slide_html(slide: Slide, figures: list[tuple[str, str]], classes: str = "") -> str:
    """One ``<section>``: the title, the text, the figures (``(caption, data URI)``), and the notes."""
    import html
    text = markdown_html(_IMAGE.sub("", slide.body).strip())
    has_text = bool(re.sub(r"<[^>]+>|\s", "", text))
    figs = "".join(f'<figure><img src="{uri}" alt="{html.escape(cap, quote=True)}"><figcaption>'
                   f'{html.escape(cap)}</figcaption></figure>' for cap, uri in figures)
    layout = "split" if figures and has_text else ("figures" if figures else "text")
    parts = [f'<section class="{("content " if slide.content else "divider ") + classes}" data-line="{slide.line}">']
    if slide.title:
        h = f"h{slide.level or 2}"      # 1: the generated title slide, 2: a claim, 3: a section
        parts.append(f"<{h}>{_inline(slide.title)}</{h}>")
    parts.append(f'<div class="body {layout} n{len(figures)}">')
    if has_text:
        parts.append(f'<div class="text">{text}</div>')
    if figures:
        parts.append(f'<div class="figs">{figs}</div>')
    parts.append("</div>")
    if slide.notes:
        parts.append(f'<aside class="notes">{markdown_html(notes_markdown(slide.notes))}</aside>')
    parts.append("</section>")
    return "\n".join(parts)


_CUE = re.compile(r"^(Demo|Ask[^:\n]{0,20}|Pre-empt):", re.M)


def notes_markdown(notes: str) -> str:
    """Speaker notes with each cue (Demo:, Ask:, Pre-empt:) as its own paragraph, its label in bold, so that the
    speaker view and the handout show them apart from the talk track."""
    return _CUE.sub(lambda m: f"\n**{m.group(1)}:**", notes)


def _inline(md: str) -> str:
    """A title's markdown (code, emphasis, math) without the paragraph around it."""
    h = markdown_html(md).strip()
    return re.sub(r"^<p>(.*)</p>$", r"\1", h, flags=re.S)


def title_slide(deck: Deck, scale_line: str) -> Slide:
    nbs = ", ".join(deck.notebooks) or "–"
    what = "notebook" if len(deck.notebooks) == 1 else "notebooks"
    body = (f"*Distributed Deep Learning on HPC* · {deck.minutes} minutes · {what} {nbs}\n\n"
            f"<p class='scale'>{scale_line}</p>")
    notes = (f"This deck fills a {deck.minutes}-minute slot (slides/AGENDA.md), talk and live demos together. "
             f"It presents {what} {nbs}: have them open in JupyterLab before you start. {scale_line[0].upper() + scale_line[1:]}. "
             "Press S for the speaker view (notes, next slide, timer).")
    return Slide(deck.title, 1, body, notes)


def agenda_slides(text: str, keys: list[str]) -> list[Slide]:
    """One slide per plan named in ``keys`` (``half``, ``full``), a table of its rows."""
    plans, _ = parse_agenda(text)
    out = []
    for k in keys:
        if k not in plans:
            raise ValueError(f"AGENDA.md has no plan {k!r} (plans: {', '.join(plans)})")
        p = plans[k]
        rows = ["| start | min | |", "|---|---|---|"]
        for r in p.rows:
            what = re.sub(r"`([^`]+)`", r"**\1**", r.what) if r.what else r.kind
            rows.append(f"| {r.start} | {r.minutes} | {what} |")
        out.append(Slide(f"Agenda: {p.heading[0].lower() + p.heading[1:]}", 2, "\n".join(rows),
                         f"The {p.heading.lower()} plan, from slides/AGENDA.md. Point out the breaks and where the "
                         "hands-on time is; the decks not in this plan are on the self-paced path."))
    return out


def page(title: str, sections: list[str]) -> str:
    """The deck's HTML: the course's template (slides/template/talk.html) with the slides in it."""
    import html
    tpl = (ROOT / "slides" / "template" / "talk.html").read_text(encoding="utf-8")
    return tpl.replace("{{TITLE}}", html.escape(title)).replace("{{SLIDES}}", "\n".join(sections))
