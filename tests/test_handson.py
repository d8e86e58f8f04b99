"""The hands-on blocks of slides/AGENDA.md and their instructor's guides (slides/guides/<block>.md).

* Every exercise a block names exists in the notebook it names, as the kind it names, and its minutes are the ones
  instructor.handson computes from the measurements in slides/exercise_minutes.json and the writing model; each
  rule is shown to fail on a planted agenda.
* The guides are what ``python -m instructor.guides write`` writes: regenerated here (every registered mistake
  through its checker), and a changed checker message makes them differ.
"""
import nbformat
import pytest

from ddlcourse import selfcheck as sc
from ddlcourse.selfcheck import Verdict
from instructor import guides, handson, talk

AGENDA = talk.AGENDA.read_text(encoding="utf-8")
DECKS = talk.load_decks()
DATA = handson.load_measurements()
INDEX = handson.exercise_index()


def test_the_blocks_keep_their_rules():
    assert handson.check_blocks(AGENDA, DATA, DECKS, INDEX) == []


def test_each_plan_has_its_blocks_and_the_full_day_a_lab():
    plans, _ = talk.parse_agenda(AGENDA)
    blocks = handson.parse_blocks(AGENDA)
    for key, share in handson.MIN_SHARE.items():
        rows = [r for r in plans[key].rows if r.kind == "hands-on"]
        assert rows and all(handson.block_of(r) in blocks for r in rows), key
        assert sum(r.minutes for r in rows) >= share * plans[key].length, key
    lab = [blocks[handson.block_of(r)] for r in plans["full"].rows if handson.block_of(r) in blocks
           and any(it.notebook.startswith("labs/") for it in blocks[handson.block_of(r)].items)]
    assert lab, "the full day runs a lab"


def test_the_index_finds_the_build_its_the_package_finds():
    for path in sorted((talk.ROOT / "notebooks").glob("*.ipynb")) + sorted((talk.ROOT / "labs").glob("*.ipynb")):
        found = [e.name for e in handson.notebook_exercises(path) if e.kind == "build-it"]
        assert found == [name for name, _ in sc.exercises(str(path))], path.name
    assert INDEX[("ring_bytes_per_rank", "notebooks/04_collectives.ipynb")].kind == "question"
    assert INDEX[("halo_exchange", "labs/02_seismic.ipynb")].kind == "build-it"


def test_a_minute_is_writing_plus_the_measured_seconds_rounded_up():
    e = INDEX[("ring_allreduce", "notebooks/04_collectives.ipynb")]
    assert handson.Figure(e, 13, 4.0, 30.0, 30.0).minutes == 5
    assert handson.Figure(e, 13, 4.0, 30.0, 31.0).minutes == 6
    fixed, per_line = handson.writing_model()
    lines = [sc.logical_lines(sc._code_exercise(n).solution) for n in handson.CALIBRATION]
    assert fixed + per_line * min(lines) == pytest.approx(handson.BAND[0])
    assert fixed + per_line * max(lines) == pytest.approx(handson.BAND[1])
    said = f"({min(lines)} and {max(lines)} lines: {fixed:.1f} minutes plus {per_line:.2f} a line)"
    assert said in " ".join(AGENDA.split()), f"AGENDA.md states the writing model as {said}"


# --------------------------------------------------------------------------- each rule fails on a planted agenda
def _first_row(name: str) -> str:
    return next(ln for ln in AGENDA.splitlines() if ln.startswith(f"| `{name}` |"))


def _replace_row(name: str, cells: list[str]) -> str:
    return AGENDA.replace(_first_row(name), "| " + " | ".join(cells) + " |", 1)


def _some_item(kind: str = "build-it") -> handson.Item:
    return next(it for b in handson.parse_blocks(AGENDA).values() for it in b.items if it.kind == kind)


def _planted_missing():
    it = _some_item()
    return _replace_row(it.name, ["`no_such_exercise`", it.kind, it.notebook, str(it.minutes)]), DATA


def _planted_wrong_notebook():
    it = _some_item()
    return _replace_row(it.name, [f"`{it.name}`", it.kind, "notebooks/01_sgd.ipynb", str(it.minutes)]), DATA


def _planted_wrong_kind():
    it = _some_item()
    return _replace_row(it.name, [f"`{it.name}`", "question", it.notebook, str(it.minutes)]), DATA


def _planted_minutes():
    it = _some_item()
    return _replace_row(it.name, [f"`{it.name}`", it.kind, it.notebook, str(it.minutes + 1)]), DATA


def _remeasured():
    slower = {s: {nb: dict(r, cells=[[cid, sec + 600.0] for cid, sec in r["cells"]]) for nb, r in runs.items()}
              for s, runs in DATA["runs"].items()}
    return AGENDA, {"runs": slower, "checks": DATA["checks"]}


def _unmeasured():
    return AGENDA, {"runs": {}, "checks": DATA["checks"]}


def _hands_on_row_minutes():
    row = next(ln for ln in AGENDA.splitlines() if "| hands-on |" in ln)
    cells = row.split("|")
    cells[2] = f" {int(cells[2]) + 1} "
    return AGENDA.replace(row, "|".join(cells), 1), DATA


def _too_little_hands_on():
    half = AGENDA.split("## Full day")[0]
    less = half.replace("| hands-on |", "| break |")
    return AGENDA.replace(half, less, 1), DATA


@pytest.mark.parametrize("case, plant, expect", [
    ("an exercise that does not exist", _planted_missing, "no exercise no_such_exercise in"),
    ("an exercise in another notebook", _planted_wrong_notebook, "in notebooks/01_sgd.ipynb"),
    ("a build-it named a question", _planted_wrong_kind, "not a question"),
    ("a minute that is not the computed one", _planted_minutes, "the measurement and the model give"),
    ("a measurement that changed", _remeasured, "the measurement and the model give"),
    ("a notebook never measured", _unmeasured, "was not measured at the"),
    ("a block row that is not its block's sum", _hands_on_row_minutes, "its exercises add up to"),
    ("a half day with too little hands-on", _too_little_hands_on, "hands-on (0%)"),
])
def test_each_block_rule_fails_on_a_planted_agenda(case, plant, expect):
    text, data = plant()
    problems = handson.check_blocks(text, data, DECKS, INDEX)
    assert any(expect in p for p in problems), (case, problems)


def test_a_block_must_follow_its_deck_and_sit_in_a_plan():
    b = next(iter(handson.parse_blocks(AGENDA).values()))
    other = next(d.name for d in DECKS if d.name != b.deck)
    text = AGENDA.replace(f"After `{b.deck}`", f"After `{other}`", 1)
    assert any(f"block {b.name} must come right after its deck {other}" in p
               for p in handson.check_blocks(text, DATA, DECKS, INDEX))
    unplaced = AGENDA.replace(f"### `{b.name}`:", f"### `{b.name}_copy`:", 1)
    assert any(f"block {b.name}_copy is in no plan" in p for p in handson.check_blocks(unplaced, DATA, DECKS, INDEX))


def test_the_cells_are_timed_in_order_in_a_kernel_at_the_scale(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# words", id="m1"),
        nbformat.v4.new_code_cell("import os\nassert os.environ['DDLCOURSE_SCALE'] == 'laptop'", id="c1")])
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    timed = handson.time_cells(path, "laptop", timeout=120)
    assert [cid for cid, _ in timed] == ["m1", "c1"] and all(s >= 0 for _, s in timed)


# --------------------------------------------------------------------------- the guides
@pytest.mark.slow
def test_the_guides_are_what_the_generator_writes():
    """Regenerated in memory (every registered mistake through its checker): a checker whose catalogue changed
    without `python -m instructor.guides write` fails here."""
    assert guides.differences(guides.guides()) == []


def test_a_guide_shows_what_the_checked_cells_print_on_the_way(tmp_path):
    def cell(src, text=None):
        c = nbformat.v4.new_code_cell(src)
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)] if text else []
        return c
    nb = nbformat.v4.new_notebook(cells=[
        cell("# NBVAL_CHECK_OUTPUT\nprint('a: True')", "a: True\n"),
        cell("print('not checked')", "not checked\n"),
        cell("# NBVAL_CHECK_OUTPUT\nsc.check('q', 1)", "[q] correct\n"),
        cell("# NBVAL_CHECK_OUTPUT\nprint('b: True')", "b: True\n"),
        cell("sc.check_code('x', x)")])
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    entry = handson.Entry("x", "build-it", str(path), nb.cells[4].id, 4)
    assert guides.on_the_way(entry, -1) == "a: True\nb: True"
    assert guides.on_the_way(entry, 0) == "b: True"
    assert guides.on_the_way(entry, 3) == ""


def test_a_changed_checker_message_makes_its_guide_differ(tmp_path, monkeypatch):
    name = next(it.name for b in handson.parse_blocks(AGENDA).values() for it in b.items
                if it.kind == "build-it" and not sc._code_exercise(it.name).distributed)
    entry = next(e for (n, _), e in INDEX.items() if n == name)
    block = handson.Block("one", "one exercise", "x", "smoke", [handson.Item(name, "build-it", entry.notebook, 1)],
                          "wait", ["why?", "how?"])
    monkeypatch.setattr(guides, "GUIDES", tmp_path)
    path = tmp_path / "one.md"
    path.write_text(guides.guide(block, DATA, INDEX), encoding="utf-8")
    assert guides.differences({path: guides.guide(block, DATA, INDEX)}) == []
    ex = sc._code_exercise(name)
    real = ex.checker

    def reworded(fn, **kwargs):
        v = real(fn, **kwargs)
        return v if v.ok else Verdict(False, "a new wording of: " + v.message)
    monkeypatch.setattr(ex, "checker", reworded)
    changed = guides.guide(block, DATA, INDEX)
    assert "a new wording of: " in changed
    assert guides.differences({path: changed}) == [f"{path} is out of date: python -m instructor.guides write"]
