"""Notebook 17 · pipeline schedules beyond 1F1B, with torch's own ``torch.distributed.pipelining``.

Run on the ranks (``mp.on_first_ranks(p, fn, ...)`` passes ``group``); every model and tensor lives on
``dist.init().device``. The model is a stack of ``Linear(dim, dim) + tanh`` blocks cut into ``p * v`` stages:

* one stage per rank (``v = 1``): GPipe, 1F1B;
* ``v = 2`` *looped* stages per rank (rank ``r`` holds stages ``r, r + p``): Interleaved1F1B, LoopedBFS,
  InterleavedZeroBubble;
* ``v = 2`` stages in a *V* (rank ``r`` holds stages ``r`` and ``2p - 1 - r``, so rank 0 holds the first and
  the last): ZBVZeroBubble, DualPipeV.

What is measured, per rank, by wrapping the stage's own compute calls (``forward_one_chunk``,
``backward_one_chunk``, ``backward_weight_one_chunk``): an event per forward ``F``, backward ``B`` (the full
backward, or only the input gradient in the zero-bubble schedules) and weight gradient ``W``; the bytes of
activations autograd keeps (``torch.autograd.graph.saved_tensors_hooks``).
"""
from __future__ import annotations


from torch.distributed import pipelining as pp


# name -> (schedule class, stages per rank, placement of the stages)
SCHEDULES = {
    "GPipe": (pp.ScheduleGPipe, 1, "loop"),
    "1F1B": (pp.Schedule1F1B, 1, "loop"),
    "Interleaved1F1B": (pp.ScheduleInterleaved1F1B, 2, "loop"),
    "LoopedBFS": (pp.ScheduleLoopedBFS, 2, "loop"),
    "InterleavedZeroBubble": (pp.ScheduleInterleavedZeroBubble, 2, "loop"),
    "ZBVZeroBubble": (pp.ScheduleZBVZeroBubble, 2, "v"),
    "DualPipeV": (pp.ScheduleDualPipeV, 2, "v"),
}


def _spec(schedule: str):
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    return SCHEDULES[schedule]


def stage_indices(schedule: str, rank: int, num_ranks: int) -> list[int]:
    """The global stage indices that ``rank`` holds under ``schedule`` (``p * v`` stages in all)."""
    _, v, placement = _spec(schedule)
    if placement == "v":
        return [rank, 2 * num_ranks - 1 - rank]
    return [rank + k * num_ranks for k in range(v)]


# bubble formulas, each for the order torch plans (see simulate_bubble): idle time of one rank in one step, in
# units of one stage's forward t_f, input-gradient backward t_b and weight-gradient backward t_w (a full backward
# is t_b + t_w); messages free, all stages equal.
BUBBLE_FORMULAS = {
    "GPipe": "(p-1)(T_F+T_B+T_W)",
    "1F1B": "(p-1)(T_F+T_B+T_W)",
    "Interleaved1F1B": "(p-1)(T_F+T_B+T_W)",
    "LoopedBFS": "(p-1)(T_F+T_B+T_W)",
    "InterleavedZeroBubble": "(p-1)(T_F+T_B-T_W)",
    "ZBVZeroBubble": "(p-1)T_F",
    "DualPipeV": "(p-1)(T_F&B+T_B^full-3T_W)",
}


def predicted_idle(schedule: str, num_ranks: int, num_micro_batches: int,
                   t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0) -> float:
    """Idle time of a rank in one step (first start to last stop on any rank), equal stages, free messages.

    ``t_f``, ``t_b``, ``t_w``: one stage's forward, input-gradient backward and weight-gradient backward on one
    micro-batch (so a full backward takes ``t_b + t_w``); the formulas, in :data:`BUBBLE_FORMULAS`:

    * GPipe, 1F1B, and the looped Interleaved1F1B and LoopedBFS: ``(p-1)(t_f + t_b + t_w)``, the fill and drain
      of ``p`` stages (Huang et al. 2019; Narayanan et al., SC'21, sec. 2.2.2, with stages ``v`` times shorter).
    * InterleavedZeroBubble, torch's ZB-H1 ("ZB1P") on looped stages: ``(p-1)(t_f + t_b - t_w)`` (Qi, Wan, Huang,
      Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 2.1; the ZB1P row of the DeepSeek-V3 Technical
      Report, 2024, Table 2, whose ``B`` is the full backward). With equal times a third of 1F1B's. Needs
      ``t_w <= t_b``.
    * ZBVZeroBubble (ZB-V, Qi et al., arXiv v2, sec. 6): no idle between a rank's first and last action, but
      rank ``r`` starts ``r`` forwards late, so a step timed from a common start keeps ``(p-1) t_f``. Zero only
      when the next step may start before this one ends everywhere (no optimizer sync, Qi et al. sec. 4).
      Needs ``t_f = t_b = t_w``, the case the schedule is built for.
    * DualPipeV (p ranks, ``2p`` stages in a V): ``(PP/2 - 1)(T_F&B + T_B - 3 T_W)`` with ``PP = 2p`` stages,
      ``T_B = t_b + t_w`` the full backward and ``T_F&B = t_f + t_b + t_w`` an overlapped forward and full
      backward (DeepSeek-V3 Technical Report, 2024, Table 2). Needs ``t_f = t_b`` and ``t_w <= t_b``.

    Outside those ranges torch's plans leave a different idle time: :func:`simulate_bubble` gives it.
    """
    p, m = num_ranks, num_micro_batches
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 and m >= 1, got p={p}, m={m}")
    if min(t_f, t_b, t_w) <= 0:
        raise ValueError(f"times must be > 0, got t_f={t_f}, t_b={t_b}, t_w={t_w}")
    _spec(schedule)
    if schedule == "InterleavedZeroBubble":
        if t_w > t_b:
            raise ValueError("the ZB-H1 formula needs t_w <= t_b; use simulate_bubble")
        return (p - 1) * (t_f + t_b - t_w)
    if schedule == "ZBVZeroBubble":
        if not t_f == t_b == t_w:
            raise ValueError("the ZB-V formula needs t_f = t_b = t_w; use simulate_bubble")
        return (p - 1) * t_f
    if schedule == "DualPipeV":
        if t_f != t_b or t_w > t_b:
            raise ValueError("the DualPipe formula needs t_f = t_b and t_w <= t_b; use simulate_bubble")
        t_fb, t_full = t_f + t_b + t_w, t_b + t_w
        pp_stages = 2 * p
        return (pp_stages // 2 - 1) * (t_fb + t_full - 3 * t_w)
    return (p - 1) * (t_f + t_b + t_w)


def predicted_bubble(schedule: str, num_ranks: int, num_micro_batches: int,
                     t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0) -> float:
    """Idle fraction of one step, ``idle / (busy + idle)``, with ``busy = v m (t_f + t_b + t_w)`` per rank.

    The idle time is :func:`predicted_idle` (equal stages, free messages; equal times by default). With equal
    times: GPipe and 1F1B ``(p-1)/(m+p-1)``; looped schedules ``(p-1)/(v m+p-1)``; InterleavedZeroBubble
    (ZB-H1) ``(p-1)/(3 v m+p-1)``; ZBVZeroBubble ``(p-1)/(3 v m+p-1)`` too (its start-up offset, not 0);
    DualPipeV ``2(p-1)/(3 v m+2(p-1))``.
    """
    idle = predicted_idle(schedule, num_ranks, num_micro_batches, t_f, t_b, t_w)
    _, v, _ = _spec(schedule)
    busy = v * num_micro_batches * (t_f + t_b + t_w)
    return idle / (busy + idle)


def predicted_held(schedule: str, stage: int, num_ranks: int, num_micro_batches: int) -> float | None:
    """Micro-batches of activations rank ``stage`` keeps at the peak, where a formula is known (else None).

    GPipe: ``m``. 1F1B: ``min(p - s, m)``: ``p - s - 1`` warm-up forwards and one more before the first
    backward. Interleaved 1F1B, on every rank but the last: likewise its warm-up forwards plus one, in units
    of ``v`` stage forwards, ``min((v-1) p + 2 (p-1-r) + 1, v m) / v``. (The last rank also holds the loss,
    on one of its two stages only, so its count in units of a whole micro-batch is not this one.)
    """
    p, m = num_ranks, num_micro_batches
    if schedule == "GPipe":
        return m
    if schedule == "1F1B":
        return min(p - stage, m)
    if schedule == "Interleaved1F1B" and stage < p - 1:
        v = SCHEDULES[schedule][1]
        return min((v - 1) * p + 2 * (p - 1 - stage) + 1, v * m) / v
    return None


# --------------------------------------------------------------------------- the interleaved order
def interleaved_order(rank: int, num_ranks: int, num_micro_batches: int, stages_per_rank: int) -> list[tuple]:
    """The compute order of ``rank`` under interleaved 1F1B (Narayanan et al. 2021), ``m % p == 0``.

    Returns ``[("F" | "B", stage, micro_batch), ...]`` with global stage indices ``rank + k * p``. Forwards
    go through the rank's stages in rounds of ``p`` micro-batches (stage ``rank`` for micro-batches 0..p-1,
    then stage ``rank + p`` for the same ones, ...); backwards visit the stages in reverse. The rank runs
    ``(v - 1) * p + 2 * (p - 1 - rank)`` warm-up forwards (at most ``v * m``), then one forward and one
    backward in turn, then the remaining backwards. The same order as torch's ``ScheduleInterleaved1F1B``.
    """
    p, m, v = num_ranks, num_micro_batches, stages_per_rank
    if not 0 <= rank < p or m < 1 or v < 1:
        raise ValueError(f"need 0 <= rank < p, m >= 1, v >= 1; got rank={rank}, p={p}, m={m}, v={v}")
    if m % p:
        raise ValueError(f"this order needs m to be a multiple of p, got m={m}, p={p}")
    total = v * m
    warmup = min((v - 1) * p + 2 * (p - 1 - rank), total)

    def nth(k: int, backward: bool) -> tuple[int, int]:
        """(stage, micro-batch) of the rank's k-th forward (or backward) op."""
        chunk = (k // p) % v
        if backward:
            chunk = v - 1 - chunk
        return rank + chunk * p, (k // (p * v)) * p + k % p

    order = [("F", *nth(k, False)) for k in range(warmup)]
    for k in range(warmup, total):
        order += [("F", *nth(k, False)), ("B", *nth(k - warmup, True))]
    order += [("B", *nth(k, True)) for k in range(total - warmup, total)]
    return order


PLANNED = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def torch_order(schedule: str, rank: int, num_ranks: int, num_micro_batches: int,
                stages_per_rank: int | None = None) -> list[tuple]:
    """The compute actions of ``rank`` in torch's own plan (``pipeline_order``), as ``(kind, stage, mb)``.

    Builds the plan without stages or process groups, for the multi-stage schedules (a private part of
    torch 2.x, used here to draw and check the orders): kinds F, B (full or input-only backward), W.
    """
    cls, v, _ = _spec(schedule)
    v = stages_per_rank or v
    if schedule not in PLANNED:
        raise ValueError(f"torch_order reads the plans of {', '.join(PLANNED)}, not {schedule!r}")
    fake = cls.__new__(cls)
    fake.pp_group_size, fake.n_local_stages, fake._n_microbatches = num_ranks, v, num_micro_batches
    fake.rank = rank
    fake.number_of_rounds = max(1, num_micro_batches // num_ranks)
    fake.microbatches_per_round = num_micro_batches // fake.number_of_rounds
    fake._num_stages = fake.num_stages = v * num_ranks
    fake.pipeline_order = {}
    ops = cls._calculate_single_rank_operations(fake, rank)
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}
    out = []
    for a in ops:
        if a is None:
            continue
        k = str(a.computation_type)
        k = getattr(a.computation_type, "value", k)
        if k in kinds:
            out.append((kinds[k], a.stage_index, a.microbatch_index))
    return out


def plan(schedule: str, num_ranks: int, num_micro_batches: int) -> dict[int, list[tuple]]:
    """Every rank's compute actions in the order torch runs them, for any schedule of :data:`SCHEDULES`.

    ``("F" | "B" | "I" | "W", stage, mb)``: forward, full backward, input-gradient backward, weight-gradient
    backward; DualPipeV's overlapped forward and backward is ``("F&B", (forward action, backward action))``.
    GPipe and 1F1B follow torch's ``_step_microbatches`` (1F1B: ``min(m, p - r)`` forwards, then a backward
    and a forward in turn); the others are torch's own plans (``_calculate_single_rank_operations``, private).
    """
    cls, v, _ = _spec(schedule)
    p, m = num_ranks, num_micro_batches
    if schedule == "GPipe":
        return {r: [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)] for r in range(p)}
    if schedule == "1F1B":
        out = {}
        for r in range(p):
            warm = min(m, p - r)
            ops = [("F", r, i) for i in range(warm)]
            for i in range(m):
                ops.append(("B", r, i))
                if warm + i < m:
                    ops.append(("F", r, warm + i))
            out[r] = ops
        return out
    fake = cls.__new__(cls)
    fake.pp_group_size, fake.n_local_stages, fake._n_microbatches = p, v, m
    fake._stages = [None] * v
    fake.number_of_rounds = max(1, m // p)
    fake.microbatches_per_round = m // fake.number_of_rounds
    fake._num_stages = fake.num_stages = v * p
    fake.pipeline_order = {}
    kinds = {"F": "F", "B": "B", "I": "I", "W": "W"}

    def one(a):
        k = getattr(a.computation_type, "value", str(a.computation_type))
        return kinds[k], a.stage_index, a.microbatch_index

    out = {}
    for r in range(p):
        ops = []
        for a in cls._calculate_single_rank_operations(fake, r):
            if a is None:
                continue
            if getattr(a, "sub_actions", None):
                ops.append(("F&B", tuple(one(x) for x in a.sub_actions)))
            else:
                ops.append(one(a))
        out[r] = ops
    return out


def simulate_bubble(schedule: str, num_ranks: int, num_micro_batches: int,
                    t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0) -> dict:
    """Run torch's plan (:func:`plan`) on a model of the ranks: each action starts when its rank is free and
    its inputs exist, messages are free, every stage takes ``t_f`` (forward), ``t_b`` (input gradient),
    ``t_w`` (weight gradient), a full backward ``t_b + t_w`` and an overlapped F&B ``t_f + t_b + t_w``.

    A forward needs the previous stage's forward of its micro-batch; a backward (full or input) this stage's
    forward and the next stage's backward; a weight gradient this stage's input gradient. Returns
    ``{bubble, idle, makespan, busy, gaps, events}``: the idle fraction ``1 - sum(busy) / (p * makespan)`` (what
    :func:`bubble` measures), the mean idle time of a rank, the step time, each rank's busy time and each
    rank's idle time between its own first start and last stop (``gaps``: without the start-up offset), and
    every action as ``(rank, kind, stage, mb, start, stop)`` (``events``: what a timeline draws).
    """
    orders = plan(schedule, num_ranks, num_micro_batches)
    n_stages = num_ranks * _spec(schedule)[1]
    dur = {"F": t_f, "I": t_b, "B": t_b + t_w, "W": t_w}
    done: dict = {}                     # (F | X | W, stage, mb) -> stop time; X: the input gradient exists
    clock = {r: 0.0 for r in orders}
    busy = {r: 0.0 for r in orders}
    nxt = {r: 0 for r in orders}
    first: dict = {}
    events: list = []                   # (rank, F | B | W, stage, mb, start, stop); an input gradient is drawn as B

    def needs(kind, stage, mb):
        if kind == "F":
            return [("F", stage - 1, mb)] if stage > 0 else []
        if kind == "W":
            return [("X", stage, mb)]
        return [("F", stage, mb)] + ([("X", stage + 1, mb)] if stage < n_stages - 1 else [])

    moved = True
    while moved:
        moved = False
        for r, ops in orders.items():
            while nxt[r] < len(ops):
                a = ops[nxt[r]]
                parts = a[1] if a[0] == "F&B" else (a,)
                deps = [d for k, st, mb in parts for d in needs(k, st, mb)]
                if any(d not in done for d in deps):
                    break
                start = max([clock[r]] + [done[d] for d in deps])
                first.setdefault(r, start)
                stop = start + sum(dur[k] for k, _, _ in parts)
                t = start
                for k, st, mb in parts:                    # the parts of an overlapped F&B, one after the other
                    events.append((r, "B" if k == "I" else k, st, mb, t, t + dur[k]))
                    t += dur[k]
                    done[("X" if k in "BI" else k, st, mb)] = stop
                    if k == "B":
                        done[("W", st, mb)] = stop
                busy[r] += sum(dur[k] for k, _, _ in parts)
                clock[r] = stop
                nxt[r] += 1
                moved = True
    if any(nxt[r] < len(ops) for r, ops in orders.items()):
        raise RuntimeError(f"{schedule}: the plan deadlocks in this model")
    span = max(clock.values())
    return dict(bubble=1.0 - sum(busy.values()) / (num_ranks * span),
                idle=span - sum(busy.values()) / num_ranks, makespan=span, busy=busy,
                gaps={r: clock[r] - first[r] - busy[r] for r in orders}, events=events)


def text_picture(orders: dict[int, list[tuple]]) -> str:
    """One line per rank: ``F0.1`` is the forward of stage 0 on micro-batch 1 (rank -> its actions, in order)."""
    return "\n".join(f"rank {r}: " + " ".join(f"{k}{s}.{mb}" for k, s, mb in ops) for r, ops in sorted(orders.items()))
