"""Exercises of notebooks/13b_fault_tolerance.ipynb: resume from the latest complete checkpoint."""
import os
import re

from ddlcourse import elastic
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise

# directory listings a restarted job may find: unpadded numbers, a write cut short, other files, nothing
_CASES = [
    ["step_000010.pt", "step_000020.pt", "log.jsonl"],
    ["step_9.pt", "step_10.pt", "step_8.pt"],
    ["step_000020.pt", "step_000030.pt.tmp", "killed-once"],
    ["log.jsonl"],
    [],
    ["ckpt/step_000100.pt", "ckpt/step_000090.pt"],
]


@exercise("lost_steps_bound", "a kill just before a checkpoint loses every step since the previous one: the interval")
def lost_steps_bound(every: int) -> float:
    return float(every)


def _steps(names, pattern=r"step_(\d+)\.pt"):
    return [(int(m.group(1)), n) for n in names for m in [re.search(pattern, os.path.basename(n))] if m]


def _sorted_as_text(names):
    found = sorted(n for n in names if re.fullmatch(r"step_\d+\.pt", os.path.basename(n)))
    return int(re.search(r"\d+", os.path.basename(found[-1])).group()) if found else 0


def _counts_tmp(names):
    return max((s for s, _ in _steps(names)), default=0)


def _first_not_latest(names):
    found = [s for s, n in _steps(names) if n.endswith(".pt")]
    return min(found) if found else 0


def _none_when_empty(names):
    found = [s for s, n in _steps(names) if n.endswith(".pt")]
    return max(found) if found else -1


@code_exercise("resume_step")
def check_resume_step(fn) -> Verdict:
    """``fn(names) -> int``: completed steps of the latest complete checkpoint ``step_<N>.pt`` in ``names``; 0 if none."""
    got = [int(fn(list(c))) for c in _CASES]
    ref = [elastic.resume_step(c) for c in _CASES]
    wrong = lambda f: [f(list(c)) for c in _CASES]  # noqa: E731
    return diagnose(got, ref, {
        "compare the step numbers as numbers, not as text ('step_9.pt' sorts after 'step_10.pt' as text)":
            wrong(_sorted_as_text),
        "a '.tmp' file is a checkpoint whose write did not finish (the job died in it): skip it": wrong(_counts_tmp),
        "take the latest checkpoint (the largest step), not the first": wrong(_first_not_latest),
        "with no checkpoint at all, start from step 0": wrong(_none_when_empty),
    }, what="the step to resume from, per directory")
