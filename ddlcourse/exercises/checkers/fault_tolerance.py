"""Checkers of notebooks/25_fault_tolerance.ipynb: its question, the step to resume from, and the training loop with
an atomic save and an exact resume the learner builds (run in a job killed at random points)."""
import os
import re

from ddlcourse import elastic, training
from ddlcourse.exercises.solutions.fault_tolerance import RESUME_VARIANTS, train_with_checkpoints
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


RESUME_HINTS = {
    "sorted_as_text":
        "compare the step numbers as numbers, not as text ('step_9.pt' sorts after 'step_10.pt' as text)",
    "counts_tmp": "a '.tmp' file is a checkpoint whose write did not finish (the job died in it): skip it",
    "first_not_latest": "take the latest checkpoint (the largest step), not the first",
    "none_when_empty": "with no checkpoint at all, start from step 0",
}


@code_exercise("resume_step")
def check_resume_step(fn) -> Verdict:
    """``fn(names) -> int``: completed steps of the latest complete checkpoint ``step_<N>.pt`` in ``names``; 0 if none."""
    got = [int(fn(list(c))) for c in _CASES]
    ref = [elastic.resume_step(c) for c in _CASES]
    wrong = lambda f: [f(list(c)) for c in _CASES]  # noqa: E731
    return diagnose(got, ref, {hint: wrong(RESUME_VARIANTS[kind]) for kind, hint in RESUME_HINTS.items()},
                    what="the step to resume from, per directory")


# --------------------------------------------------------------------------- build it: atomic save and exact resume
class _Killed(Exception):
    """The checker's stand-in for a process killed by a failure."""


_FT_STEPS, _FT_EVERY = 16, 4


def ft_schedule(rng) -> list[dict]:
    """Where the checker's job dies, drawn from ``rng`` (a ``random.Random``): per attempt the step before which
    it dies (``kill_step``) or the save call of that attempt (1, 2, ...) that dies half-way through the write
    (``kill_save``); two of each kind... no: two step kills and one save kill, in a random order, then an attempt
    that runs to the end. Every kill comes after the first checkpoint and two steps after the restart, so every
    restart resumes from a checkpoint and runs steps that show a lost RNG or optimizer state."""
    while True:
        done, attempts = 0, []                      # done: the steps of the latest complete checkpoint
        for kind in rng.sample(["step", "step", "save"], 3):
            if kind == "step":
                lo = max(done + 2, _FT_EVERY)
                if lo > _FT_STEPS - 2:
                    break
                step = rng.randint(lo, _FT_STEPS - 2)
                attempts.append(dict(kill_step=step))
                done = step // _FT_EVERY * _FT_EVERY
            else:
                saves_left = (_FT_STEPS - done) // _FT_EVERY
                lo = 2 if done == 0 else 1          # the first kill comes after a complete checkpoint
                if lo > saves_left - 1:
                    break
                j = rng.randint(lo, saves_left - 1)
                attempts.append(dict(kill_save=j))
                done += (j - 1) * _FT_EVERY
        else:
            if _FT_EVERY <= done <= _FT_STEPS - 2:
                return attempts + [dict()]


def _describe(attempts) -> str:
    kills = [f"before step {k['kill_step']}" if "kill_step" in k else f"in the middle of save {k['kill_save']} of "
             f"attempt {a}" for a, k in enumerate(attempts) if k]
    return "this check killed the job " + ", then ".join(kills) + " (the points are drawn anew on every check)"


def _ft_job(fn, folder, attempts):
    """Run ``fn`` as a job that fails and restarts: per attempt a fresh process (new model, optimizer and RNG seed).
    Returns the (attempt, step, loss) log, the final parameters and a complaint about a partial checkpoint."""
    import io

    import torch
    log = []
    real_save = torch.save
    for a, kill in enumerate(attempts):
        torch.manual_seed(0)                        # every process builds the same initial model ...
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(1000 + a)                 # ... and starts its RNG afresh

        def step_fn(model, opt, step, a=a, kill=kill):
            if step == kill.get("kill_step"):
                raise _Killed(f"killed before step {step}")
            g = torch.Generator().manual_seed(step)            # the data of step s is a function of s
            x = torch.randn(16, 4, generator=g)
            y = x.sum(dim=1, keepdim=True).sin()
            keep = (torch.rand(16, 4) > 0.25).float() / 0.75   # dropout: torch's global RNG
            loss = ((model(x * keep) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.append((a, step, loss.item()))
            return loss.item()

        saves = [0]

        def dying_save(obj, f, *args, kill=kill, **kw):
            saves[0] += 1
            if saves[0] != kill.get("kill_save"):
                return real_save(obj, f, *args, **kw)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kw)
            half = buf.getvalue()[: len(buf.getvalue()) // 2]
            if isinstance(f, (str, os.PathLike)):
                with open(f, "wb") as out:
                    out.write(half)
            else:
                f.write(half)
            raise _Killed("killed in the middle of torch.save")

        torch.save = dying_save
        try:
            fn(model, opt, step_fn, _FT_STEPS, folder, _FT_EVERY)
        except _Killed:
            pass
        finally:
            torch.save = real_save
        for name in sorted(os.listdir(folder)):
            if re.fullmatch(r"step_\d+\.pt", name):
                try:
                    torch.load(os.path.join(folder, name))
                except Exception:
                    return log, None, (f"after a crash in the middle of a write, {name} is a partial file that the "
                                       "resume would load: the write is not atomic. Save to a temporary file in the "
                                       "same folder (step_<N>.pt.tmp), then os.replace it to step_<N>.pt")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    return log, params, None


@code_exercise("train_with_checkpoints", distributed=False)
def check_train_with_checkpoints(fn, **_) -> Verdict:
    """``fn(model, opt, step_fn, n_steps, ckpt_dir, every)`` in a job killed three times at random points (twice
    before a step, once in the middle of a checkpoint's write, see :func:`ft_schedule`) and restarted each time: the steps each attempt runs and
    their losses against the reference job and an uninterrupted run."""
    import random
    import shutil

    attempts = ft_schedule(random.Random())
    folders = [str(training.run_dir("selfcheck-ckpt")) for _ in range(3)]
    try:
        got, params, partial = _ft_job(fn, folders[0], attempts)
        # the reference job runs the reference solution: the package's elastic loop trains its own model and keeps
        # no RNG state, so it cannot replay this job
        ref, ref_params, _ = _ft_job(train_with_checkpoints, folders[1], attempts)
        plain, _, _ = _ft_job(train_with_checkpoints, folders[2], attempts=[dict()])
    finally:
        for f in folders:
            shutil.rmtree(f, ignore_errors=True)
    v = Verdict(False, partial) if partial else _judge(got, params, ref, ref_params, plain, len(attempts))
    return v if v.ok else Verdict(False, f"{v.message}. ({_describe(attempts)})")


def _judge(got, params, ref, ref_params, plain, n_attempts) -> Verdict:
    """The learner's job's (attempt, step, loss) log and final parameters against the reference job's and an
    uninterrupted run's."""
    loss_at = {s: l for _, s, l in plain}
    for a in range(n_attempts):
        mine = [s for b, s, _ in got if b == a]
        want = [s for b, s, _ in ref if b == a]
        if mine == want:
            continue
        if a and mine and want and mine[0] != want[0]:
            what = "skipped" if mine[0] > want[0] else "done twice"
            return Verdict(False, f"resume off by one: after restart {a} your job started at step {mine[0]}, the latest "
                                  f"complete checkpoint says {want[0]} steps were done (step_{want[0]}.pt), so step "
                                  f"{min(mine[0], want[0])} is {what}. Start the loop at N: range(N, n_steps)")
        return Verdict(False, f"attempt {a} (restart {a}) ran steps {mine}, expected {want}: resume from the latest "
                              f"complete checkpoint and save step_<N>.pt after every {_FT_EVERY} steps (N = steps done)")
    for a, s, l in got:
        if abs(l - loss_at[s]) > 1e-6 * max(1.0, abs(loss_at[s])):
            first = min(st for b, st, _ in got if b == a)
            if s == first:
                return Verdict(False, f"the loss of step {s}, the first after restart {a}, differs from an uninterrupted "
                                      "run: the random numbers differ (dropout). Save torch's RNG state "
                                      "(torch.get_rng_state()) with the model and restore it (torch.set_rng_state)")
            return Verdict(False, f"after restart {a}, step {first} is right but step {s} differs from an uninterrupted "
                                  "run: restore the optimizer's state (SGD's momentum) with the model")
    if params is None or len(params) != len(ref_params) or \
            max(abs(x - y) for x, y in zip(params, ref_params)) > 1e-6:
        return Verdict(False, "the losses are right but the final parameters differ from the reference job's")
    return Verdict(True)
