"""Reference solutions of notebooks/25_fault_tolerance.ipynb: the step to resume from, and the training loop with an
atomic save and an exact resume; each with typical mistakes (what :mod:`ddlcourse.exercises.checkers.fault_tolerance`
must name)."""
import os
import re

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- the step to resume from
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


RESUME_VARIANTS = {"sorted_as_text": _sorted_as_text, "counts_tmp": _counts_tmp, "first_not_latest": _first_not_latest,
                   "none_when_empty": _none_when_empty}


@reference("resume_step", mistakes=[
    (_sorted_as_text, "not as text"),
    (_counts_tmp, "skip it"),
    (_first_not_latest, "take the latest checkpoint"),
    (_none_when_empty, "start from step 0"),
])
def resume_step(names):
    """N of the latest complete checkpoint "step_<N>.pt" among the file names ``names``, or 0 when there is none."""
    found = []
    for name in names:
        m = re.fullmatch(r"step_(\d+)\.pt", os.path.basename(name))   # not "step_30.pt.tmp": its write did not end
        if m:
            found.append(int(m.group(1)))                               # compare numbers, not text
    return max(found, default=0)


# --------------------------------------------------------------------------- build it: atomic save and exact resume
def train_with_checkpoints(model, opt, step_fn, n_steps, ckpt_dir, every):
    """Run steps ``0 .. n_steps - 1`` (``step_fn(model, opt, step) -> loss``), resuming from the latest complete
    checkpoint ``step_<N>.pt`` in ``ckpt_dir``; after every ``every`` steps save ``step_<N>.pt`` atomically (a
    ``.tmp`` file in the same folder, then ``os.replace``) with the model, the optimizer and torch's RNG state."""
    import torch
    done = [int(m.group(1)) for m in (re.fullmatch(r"step_(\d+)\.pt", n) for n in os.listdir(ckpt_dir)) if m]
    start = max(done, default=0)
    if start:                                       # resume: everything that decides the next step
        ck = torch.load(os.path.join(ckpt_dir, f"step_{start}.pt"))
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        torch.set_rng_state(ck["rng"])
    for step in range(start, n_steps):
        step_fn(model, opt, step)
        if (step + 1) % every == 0:
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state()}
            path = os.path.join(ckpt_dir, f"step_{step + 1}.pt")
            torch.save(state, path + ".tmp")        # a crash here leaves only the .tmp file
            os.replace(path + ".tmp", path)         # atomic: the checkpoint is complete or absent


def _ft_variant(kind):
    """train_with_checkpoints with one typical mistake: "direct" (torch.save straight to step_<N>.pt), "skip" (resume
    at step N + 1), "no_rng" (torch's RNG state not saved), "no_opt" (the optimizer's state not saved)."""
    def train(model, opt, step_fn, n_steps, ckpt_dir, every):
        import torch
        done = [int(m.group(1)) for m in (re.fullmatch(r"step_(\d+)\.pt", n) for n in os.listdir(ckpt_dir)) if m]
        start = max(done, default=0)
        if start:
            ck = torch.load(os.path.join(ckpt_dir, f"step_{start}.pt"))
            model.load_state_dict(ck["model"])
            if kind != "no_opt":
                opt.load_state_dict(ck["opt"])
            if kind != "no_rng":
                torch.set_rng_state(ck["rng"])
            start += kind == "skip"
        for step in range(start, n_steps):
            step_fn(model, opt, step)
            if (step + 1) % every == 0:
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state()}
                path = os.path.join(ckpt_dir, f"step_{step + 1}.pt")
                if kind == "direct":
                    torch.save(state, path)
                else:
                    torch.save(state, path + ".tmp")
                    os.replace(path + ".tmp", path)
    train.__name__ = f"train_with_checkpoints_{kind}"
    return train


reference("train_with_checkpoints", mistakes=[
    (_ft_variant("direct"), "not atomic"),
    (_ft_variant("skip"), "off by one"),
    (_ft_variant("no_rng"), "RNG state"),
    (_ft_variant("no_opt"), "optimizer's state"),
])(train_with_checkpoints)
