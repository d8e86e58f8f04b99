"""Checkers of notebooks/16_pipeline.ipynb: its questions, the 1F1B order of one stage, then a 1F1B executor for one
stage (their references and typical mistakes are in :mod:`ddlcourse.exercises.solutions.pipeline`)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from ddlcourse.exercises.checkers.model_parallel import HINTS, N_CLASSES, P2P, WIDTHS, _flat_grads, _stages
from ddlcourse.exercises.solutions.pipeline import ORDER_VARIANTS
from ddlcourse.parallel.pipeline import schedule_order
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise, order_verdict


@exercise("bubble_fraction", "(p - 1) / (m + p - 1)")
def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


@exercise("min_micro_batches", "solve (p - 1) / (m + p - 1) <= b for m and round up")
def min_micro_batches(num_stages: int, max_bubble: float) -> int:
    m = 1
    while (num_stages - 1) / (m + num_stages - 1) > max_bubble + 1e-12:
        m += 1
    return m


# --------------------------------------------------------------------------- coding exercise: the 1F1B order
def _as_ops(order) -> list[str]:
    return [f"{k}{int(i)}" for k, i in order]


ORDER_HINTS = {
    "gpipe": "that is GPipe's order (all forwards, then all backwards): in 1F1B a stage starts its first "
             "backward as soon as the warm-up forwards are done, then alternates one forward, one backward",
    "one_too_many": "one warm-up forward too many: stage s runs p - s - 1 of them (the last stage none), "
                    "not p - s",
    "one_too_few": "one warm-up forward too few: stage s runs p - s - 1 of them (the last stage none), "
                   "not p - s - 2",
    "reversed": "the warm-up is reversed: the first stage runs the most warm-up forwards (p - s - 1 for "
                "stage s), the last stage none",
}


def _order_check(ops: list[str], s: int, p: int, m: int, where: str) -> Verdict | None:
    return order_verdict(ops, _as_ops(schedule_order("1f1b", s, p, m)), where,
                         [(_as_ops(ORDER_VARIANTS[kind](s, p, m)), hint) for kind, hint in ORDER_HINTS.items()],
                         "every micro-batch needs exactly one F and one B")


@code_exercise("one_f_one_b", distributed=False)
def check_one_f_one_b(fn, **_) -> Verdict:
    """``fn(stage, num_stages, num_micro_batches) -> [("F", i) | ("B", i), ...]``: the 1F1B order of one stage,
    against ``pipeline.schedule_order("1f1b", ...)``, for several stages, stage counts and micro-batch counts
    (including fewer micro-batches than stages)."""
    for p, m in ((4, 8), (4, 2), (2, 5), (3, 3)):
        for s in range(p):
            verdict = _order_check(_as_ops(fn(s, p, m)), s, p, m, f"stage {s} of {p}, {m} micro-batches")
            if verdict is not None:
                return verdict
    return Verdict(True)


# --------------------------------------------------------------------------- build it: a 1F1B executor
EXEC_HINTS = {
    "not_divided": "the gradients are m times too large: the step's loss is the mean over the micro-batches, "
                   "so divide each micro-batch's loss by the number of micro-batches",
    "not_accumulated": "only the last micro-batch's gradient is left: the gradients of all micro-batches must "
                       "add up in .grad (backward adds; do not zero or overwrite .grad between micro-batches)",
    "dtype": "a tensor went to another stage in another dtype than the stages compute in: send the activation "
             "and its gradient as they are (no .double(), no trip through numpy), so the next stage's layers "
             "and backward get the dtype of their parameters",
    "lifo": "a backward paired a gradient with another micro-batch's output: gradients come back in the order "
            "of the forwards, so each backward takes the OLDEST saved micro-batch (first in, first out)",
}
ROWS = (3, 4, 5, 6, 7, 8)           # micro-batch i has ROWS[i] samples: a tensor's rows name its micro-batch


class _DryRun:
    """send/recv for a rehearsal of the learner's executor on this rank alone: nothing travels, so nothing can
    hang. recv returns the next activation (from rank - 1) or gradient (from rank + 1) in micro-batch order, of
    the right shape; the calls are turned into the stage's order of F and B. A receive that the neighbour could
    never answer (the gradient of a micro-batch not yet sent forward, an activation past the last micro-batch) is
    the deadlock it would be on the ranks, and raises."""

    def __init__(self, s: int, p: int, m: int, dims: list[int], dtype=torch.float32):
        self.s, self.p, self.m, self.dims, self.dtype = s, p, m, dims, dtype
        self.ops, self.n_act, self.n_grad, self.problems = [], 0, 0, []
        self.n_forward = 0                       # activations sent to rank s + 1
        self.gen = torch.Generator().manual_seed(1000 + s)

    def send(self, t, dst):
        s = self.s
        if t is None:
            self.problems.append("none")
            raise TypeError(f"rank {s} sent None to rank {dst}")
        if dst not in (s - 1, s + 1) or not 0 <= dst < self.p:
            self.problems.append("peer")
            raise ValueError(f"rank {s} sent to rank {dst}")
        if isinstance(t, torch.Tensor) and t.dtype != self.dtype:
            self.problems.append("dtype")
            raise TypeError(f"rank {s} sent {t.dtype} to rank {dst}; the stages compute in {self.dtype}")
        mb = ROWS.index(t.shape[0]) if t.shape[0] in ROWS else -1
        self.n_forward += dst == s + 1
        if dst == s + 1 and s == 0:
            self.ops.append(f"F{mb}")
        if dst == s - 1 and s == self.p - 1:
            self.ops.append(f"B{mb}")

    def recv(self, src):
        s = self.s
        if src not in (s - 1, s + 1) or not 0 <= src < self.p:
            self.problems.append("peer")
            raise ValueError(f"rank {s} received from rank {src}")
        if src == s - 1 and self.n_act >= self.m:
            self.problems.append("waits")
            raise RuntimeError(f"stage {s} waits for activation {self.n_act + 1} from rank {src}, which sends only "
                               f"{self.m} (one per micro-batch): on the ranks it would wait for ever")
        if src == s + 1 and self.n_grad >= self.n_forward:
            self.problems.append("waits")
            raise RuntimeError(f"stage {s} waits for the gradient of micro-batch {self.n_grad} from rank {src} before "
                               "it has sent that micro-batch forward: on the ranks the two stages would wait for "
                               "each other for ever (deadlock)")
        if src == s - 1:
            k, self.n_act = self.n_act, self.n_act + 1
            self.ops.append(f"F{k}")
            return torch.randn(ROWS[k % len(ROWS)], self.dims[s], generator=self.gen)
        k, self.n_grad = self.n_grad, self.n_grad + 1
        self.ops.append(f"B{k}")
        return torch.randn(ROWS[k % len(ROWS)], self.dims[s + 1], generator=self.gen)


def _data(m: int):
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(ROWS[i], WIDTHS[0], generator=gen) for i in range(m)]
    ys = [torch.randint(0, N_CLASSES, (ROWS[i],), generator=gen) for i in range(m)]
    return xs, ys


def _rehearse(fn, s: int, p: int, m: int) -> Verdict | None:
    """The learner's executor on this rank alone (see :class:`_DryRun`): a verdict when its order or its use
    of the micro-batches is wrong, else None."""
    dims = list(WIDTHS[:p]) + [N_CLASSES]
    xs, ys = _data(m)
    fake = _DryRun(s, p, m, dims)
    stage = copy.deepcopy(_stages(p)[s])
    where = f"stage {s} of {p}, {m} micro-batches"
    try:
        fn(stage, xs if s == 0 else None, ys if s == p - 1 else None, nn.CrossEntropyLoss(), s, p, m,
           fake.send, fake.recv)
    except NotImplementedError:
        return Verdict(False, "not written yet")
    except Exception as e:        # noqa: BLE001
        if "peer" in fake.problems:
            return Verdict(False, f"{where}: {HINTS['wrong_neighbour']}")
        if "none" in fake.problems:
            return Verdict(False, f"{where}: {HINTS['no_requires_grad']}")
        if "waits" in fake.problems:
            return Verdict(False, f"{where}: {e}")
        if "dtype" in fake.problems:
            return Verdict(False, f"{where}: {e}: {EXEC_HINTS['dtype']}")
        if "Mismatch in shape" in str(e) or "grad_output" in str(e):
            return Verdict(False, f"{where}: {EXEC_HINTS['lifo']}")
        return Verdict(False, f"{where}: your function raised {type(e).__name__}: {e}")
    return _order_check(fake.ops, s, p, m, where)


@code_exercise("pipeline_1f1b", distributed=True, ranks=(2, 3, 4))
def check_pipeline_1f1b(fn, **_) -> Verdict:
    """On every rank (rank s runs stage s): ``fn(stage, inputs, targets, loss_fn, rank, world, num_micro_batches,
    send, recv)`` runs one 1F1B step. First a rehearsal on each rank alone (nothing travels, so a wrong order
    cannot deadlock) checks the order of F and B and the pairing of gradients with micro-batches; then the real
    run over the ranks is compared with one serial step on the same micro-batches (the loss is their mean)."""
    link = P2P()
    s, p = link.rank, link.world
    rehearsal = None
    for m in (6, 2):
        rehearsal = rehearsal or _rehearse(fn, s, p, m)
    link.not_written = rehearsal is not None and rehearsal.message == "not written yet"
    every = link.gather(None if rehearsal is None else rehearsal.message)
    bad = [(r, msg) for r, msg in enumerate(every) if msg is not None]
    if bad:
        return Verdict(False, bad[0][1])
    m = 6
    xs, ys = _data(m)
    loss_fn = nn.CrossEntropyLoss()
    stage = _stages(p)[s]
    err = link.run(fn, stage, xs if s == 0 else None, ys if s == p - 1 else None, loss_fn, s, p, m,
                   link.send, link.recv)
    every = link.gather((link.problems, repr(err) if err else None))
    problems = [pr for e in every for pr in e[0]]
    if "timeout" in problems:
        return Verdict(False, "two ranks waited for each other's message: check the order of your sends and "
                              "receives against the schedule")
    # an exception on one rank leaves its neighbours without the message it would have sent: name the cause
    errors = [(r, e[1]) for r, e in enumerate(every) if e[1] and not e[1].startswith("NeverSent")]
    if errors:
        r, e = errors[0]
        hint = f": {EXEC_HINTS['dtype']}" if "dtype" in e else ""
        return Verdict(False, f"your function raised on rank {r}: {e}{hint}")
    if any(isinstance(pr, tuple) for pr in problems):
        return Verdict(False, HINTS["no_grad_back"])

    def serial(kind=None):
        stages = _stages(p)
        for i in range(m) if kind != "last" else [m - 1]:
            loss = loss_fn(nn.Sequential(*stages)(xs[i]), ys[i]) / (1 if kind == "sum" else m)
            loss.backward()
        return _flat_grads(stages[s])

    verdict = diagnose(_flat_grads(stage), serial(),
                       {EXEC_HINTS["not_divided"]: serial("sum"), EXEC_HINTS["not_accumulated"]: serial("last")},
                       what=f"rank {s}'s parameter gradients")
    bad = [(r, v) for r, v in enumerate(link.gather((verdict.ok, verdict.message))) if not v[0]]
    return Verdict(True) if not bad else Verdict(False, f"rank {bad[0][0]}: {bad[0][1][1]}")
