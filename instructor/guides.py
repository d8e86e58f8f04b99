"""The instructor's guide to each hands-on block of slides/AGENDA.md: slides/guides/<block>.md, generated.

    python -m instructor.guides write        # (re)write slides/guides/<block>.md for every block
    python -m instructor.guides check        # exit 1 when a guide is not what write would write

A guide takes the block's exercises in order with their minutes (:mod:`instructor.handson`), and for each one what
the notebook's checked cells print on the way to it, what the check prints for a right answer, what its checker says
for every typical mistake, and the reference for the debrief; then what to do if the cluster is slow and the
debrief's questions, from the agenda. The checkers' words are generated, never copied: every mistake registered with
a reference solution (``selfcheck.reference(name, mistakes=...)``) runs through its checker, here
(``selfcheck.check_code``) or, for a distributed exercise, on simulated ranks (``selfcheck.rehearse``), and the guide
shows what the learner's check prints. So a guide changes when a checker's catalogue does, and tests/test_handson.py
fails until the guides are written again.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
from pathlib import Path

from ddlcourse import selfcheck as sc
from instructor import handson, talk

GUIDES = talk.ROOT / "slides" / "guides"
SHORT = 10               # a reference of this many lines or fewer is shown whole

# What changes from run to run (a rehearsal's seconds) or with the reference's file (its line numbers) is shown as N.
_VARIES = ((re.compile(r"\bin \d+(?:\.\d+)? s\b"), "in N s"), (re.compile(r"\bline \d+"), "line N"))


def _steady(message: str) -> str:
    for pattern, replacement in _VARIES:
        message = pattern.sub(replacement, message)
    return message


def printed(name: str, fn) -> str:
    """What the learner's check of build-it ``name`` prints for ``fn``: ``selfcheck.check_code`` here, or, for a
    distributed exercise, its rehearsal on 2 simulated ranks (the exercise's first world size without 2), printed as
    ``selfcheck.check_on_ranks`` prints it: what stopped the rehearsal, or the verdicts of its ranks."""
    ex = sc._code_exercise(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if not ex.distributed:
            sc.check_code(name, fn)
        else:
            verdicts, rehearsal = sc.rehearse(name, fn, 2 if 2 in ex.ranks else ex.ranks[0])
            if rehearsal.finished_cleanly:
                sc._say(name, verdicts, True)
            else:
                print(f"[{name}] not yet: {verdicts[0].message}")
    return _steady(out.getvalue().strip())


def mistakes(name: str) -> list[tuple[str, str]]:
    """``(what the mistake is, what the checker says)`` for every typical mistake registered for build-it ``name``."""
    return [(fragment, printed(name, wrong)) for wrong, fragment in sc._code_exercise(name).mistakes]


def source(fn) -> str:
    """The source of ``fn`` from its ``def`` line (without a decorator above it)."""
    src = textwrap.dedent(inspect.getsource(fn))
    return "\n".join(src.splitlines()[ast.parse(src).body[0].lineno - 1:])


def walkthrough(fn) -> str:
    """The reference's steps for the debrief: its lines that carry a comment, in order (the whole source when it is
    SHORT lines or fewer, or has no comment)."""
    src = source(fn)
    lines = src.splitlines()
    commented = sorted({t.start[0] for t in tokenize.generate_tokens(io.StringIO(src).readline)
                        if t.type == tokenize.COMMENT})
    if len(lines) <= SHORT or not commented:
        return src
    return "\n".join(lines[i - 1].strip() for i in commented)


def where(fn) -> str:
    return f"`{Path(inspect.getsourcefile(fn)).resolve().relative_to(talk.ROOT)}`, `{fn.__name__}`"


def _cells(notebook: str) -> list[dict]:
    return json.loads((talk.ROOT / notebook).read_text(encoding="utf-8"))["cells"]


def on_the_way(entry: handson.Entry, after: int) -> str:
    """What the notebook's checked cells (``# NBVAL_CHECK_OUTPUT``) print between its cell ``after`` and the cell
    of ``entry``, as stored with the notebook; cells that check an exercise are left out (they print the learner's
    verdict)."""
    texts = []
    for c in _cells(entry.notebook)[after + 1:entry.index]:
        src = "".join(c["source"])
        if c["cell_type"] != "code" or "NBVAL_CHECK_OUTPUT" not in src or handson._CALL.search(src):
            continue
        for o in c.get("outputs", []):
            text = o.get("text") if o["output_type"] == "stream" else o.get("data", {}).get("text/plain")
            texts.append("".join(text or "").strip())
    return "\n".join(t for t in texts if t)


def answer(entry: handson.Entry) -> str:
    """The reference answer of a question for the arguments its notebook's check passes, when they are written out;
    else which values of the run it takes."""
    cells = {c.get("id", ""): "".join(c["source"]) for c in _cells(entry.notebook)}
    call = next(n for n in ast.walk(ast.parse(cells[entry.cell])) if isinstance(n, ast.Call)
                and getattr(n.func, "id", getattr(n.func, "attr", "")) == "check"
                and isinstance(n.args[0], ast.Constant) and n.args[0].value == entry.name)
    if any(isinstance(n, (ast.Name, ast.Attribute, ast.Call)) for k in call.keywords for n in ast.walk(k.value)):
        return "is computed from the run: " + ", ".join(f"`{k.arg}={ast.unparse(k.value)}`" for k in call.keywords)
    # numbers and arithmetic only: no name to look up, nothing to call
    kwargs = {k.arg: eval(compile(ast.Expression(k.value), entry.notebook, "eval"), {"__builtins__": {}})
              for k in call.keywords}
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    value = handson.reference_of(entry)(**kwargs)
    try:
        value = f"{float(value):.6g}"
    except (TypeError, ValueError):       # not one number
        value = repr(value)
    return f"is `{value}`" + (f" (for {shown})" if shown else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _fenced(text: str, lang: str = "text", indent: str = "") -> list[str]:
    return [f"{indent}```{lang}", *[f"{indent}{ln}" if ln else "" for ln in text.splitlines()], f"{indent}```"]


def exercise_section(i: int, f: handson.Figure, after: int) -> list[str]:
    """The guide's section on exercise ``f.entry``, the learner having run its notebook through cell ``after``."""
    e = f.entry
    ref = handson.reference_of(e)
    out = [f"### {i}. `{e.name}` ({e.kind}, {e.notebook}, {f.minutes} min)", ""]
    expected = on_the_way(e, after)
    if expected:
        out += ["**On the way to it** the notebook's checked cells print (their stored output, which the tests hold "
                "them to; each claim prints True at every scale):", "", *_fenced(expected), ""]
    if e.kind == "question":
        out += [f"**The answer** {answer(e)}.", "",
                f"**When it is wrong** the check prints its hint: *{sc.EXERCISES[e.name][1]}*", ""]
    else:
        out += ["**When it is right** the check prints", "", *_fenced(printed(e.name, ref)), "",
                "**What the checker says** to each typical mistake (registered with the reference, in "
                f"{where(ref).split(',')[0]}):", ""]
        for n, (fragment, said) in enumerate(mistakes(e.name), 1):
            out += [f"{n}. *{fragment}*", "", *_fenced(said, indent="   "), ""]
    if e.kind == "question":
        out += [f"**The reference answer** ({where(ref)}):", "", *_fenced(source(ref), "python"), ""]
    else:
        out += [f"**The reference**, for the debrief ({where(ref)}; {_count(f.lines, 'logical line')}): "
                + ("its whole source" if walkthrough(ref) == source(ref) else "its lines that carry a comment, in order")
                + f". At the debrief, `selfcheck.solution(\"{e.name}\")` prints it all.", "",
                *_fenced(walkthrough(ref), "python"), ""]
    return out


HIDDEN = (f"**Keep the solutions until the debrief.** Each build-it's reference is in "
          "`ddlcourse/exercises/solutions/<topic>.py`, and `selfcheck.solution(\"NAME\")` prints it in a notebook. "
          f"Start JupyterLab, or the cluster job that runs the kernels, with `{sc.SOLUTIONS_VAR}=hidden` in its "
          "environment: `selfcheck.solution` then prints that the solutions are kept until the debrief, and a lab that "
          "falls back to the reference stops saying how to show it. The files stay in place (the checkers import "
          "them for the typical mistakes), so this keeps them out of sight, not out of reach. Unset it for the "
          "debrief.")


def guide(block: handson.Block, data: dict, index: dict) -> str:
    """The guide of ``block``, as Markdown."""
    figs = handson.figures(block, data, index)
    kinds = [f.entry.kind for f in figs]
    out = [f"# Hands-on: {block.title}", "",
           "<!-- Generated by `python -m instructor.guides write` from slides/AGENDA.md, the checkers and the "
           "reference solutions: edit those, then write the guides again. -->", "",
           f"After the deck `{block.deck}`, at the {block.scale} scale: {block.minutes} minutes for "
           f"{_count(kinds.count('build-it'), 'build-it')} and {_count(kinds.count('question'), 'checked question')}. "
           "Each minute is the model's reading and writing time plus the measured run of the notebook's cells and "
           "check (slides/AGENDA.md says how). What a check prints comes from running it here, a distributed one "
           "rehearsed on 2 simulated ranks: on the room's clusters the number of ranks can differ.", "",
           "## Before the block", "", HIDDEN, "", f"**If the cluster is slow.** {block.slow}"]
    if block.scale != "smoke":
        smoke = sum(f.minutes for f in handson.figures(block, data, index, scale="smoke"))
        out[-1] += f" At the smoke scale the block takes {smoke} minutes, measured the same way."
    out += ["", "## The exercises, in order", "",
            "| # | exercise | kind | notebook | writing (model) | run + check (measured) | minutes |",
            "|---|---|---|---|---|---|---|"]
    out += [f"| {i} | `{f.entry.name}` | {f.entry.kind} | {f.entry.notebook} | {f.writing:.1f} min "
            f"({_count(f.lines, 'line')}) | {f.run_s + f.check_s:.0f} s | {f.minutes} |" for i, f in enumerate(figs, 1)]
    out.append("")
    done: dict[str, int] = {}            # notebook -> the cell of the block's previous exercise in it
    for i, f in enumerate(figs, 1):
        out += exercise_section(i, f, done.get(f.entry.notebook, -1))
        done[f.entry.notebook] = f.entry.index
    out += ["## Debrief", ""] + [f"{i}. {q}" for i, q in enumerate(block.debrief, 1)]
    return "\n".join(out) + "\n"


def guides() -> dict[Path, str]:
    """``{path: text}`` of every block's guide."""
    data, index = handson.load_measurements(), handson.exercise_index()
    blocks = handson.parse_blocks(talk.AGENDA.read_text(encoding="utf-8"))
    return {GUIDES / f"{b.name}.md": guide(b, data, index) for b in blocks.values()}


def differences(made: dict[Path, str]) -> list[str]:
    """The guides on disk that are not what ``made`` holds, and guides of no block."""
    def shown(p: Path) -> Path:
        return p.relative_to(talk.ROOT) if p.is_relative_to(talk.ROOT) else p

    out = [f"{shown(p)} is out of date: python -m instructor.guides write" for p, text in made.items()
           if not p.exists() or p.read_text(encoding="utf-8") != text]
    out += [f"{shown(p)} is the guide of no block in slides/AGENDA.md"
            for p in sorted(GUIDES.glob("*.md")) if p not in made]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instructor.guides",
                                description="Write, or check, the guide to each hands-on block of slides/AGENDA.md.")
    p.add_argument("action", choices=["write", "check"])
    a = p.parse_args(argv)
    made = guides()
    if a.action == "check":
        problems = differences(made)
        print("\n".join(problems) or f"{len(made)} guides are up to date")
        return 1 if problems else 0
    GUIDES.mkdir(parents=True, exist_ok=True)
    for path, text in made.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(talk.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
