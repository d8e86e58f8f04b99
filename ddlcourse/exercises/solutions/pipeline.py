"""Reference solutions of notebooks/16_pipeline.ipynb: the 1F1B order of one stage and a 1F1B executor for one
stage, and each with one typical mistake (what its checker, :mod:`ddlcourse.exercises.checkers.pipeline`, must
name)."""
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: the 1F1B order
def one_f_one_b_solution(stage, num_stages, num_micro_batches):
    """The 1F1B order of stage ``stage``: a list of ("F", i) and ("B", i), micro-batch i = 0 .. m-1."""
    m = num_micro_batches
    warmup = min(num_stages - stage - 1, m)          # the last stage none, the first p - 1
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):                      # steady state: one forward, one backward
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def _order_variant(kind: str):
    """Typical wrong 1F1B orders ``(stage, num_stages, m) -> [("F", i) | ("B", i), ...]``."""
    def order(stage, num_stages, m):
        if kind == "gpipe":                                   # all forwards, then all backwards
            return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        warmup = {"one_too_many": num_stages - stage, "one_too_few": max(num_stages - stage - 2, 0),
                  "reversed": stage}[kind]
        warmup = min(warmup, m)
        out = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            out += [("F", warmup + i), ("B", i)]
        return out + [("B", i) for i in range(m - warmup, m)]
    order.__name__ = f"one_f_one_b_{kind}"
    return order


# The checker computes each wrong order to name the learner's mistake (keyed as its ORDER_HINTS).
ORDER_VARIANTS = {kind: _order_variant(kind) for kind in ("gpipe", "one_too_many", "one_too_few", "reversed")}

reference("one_f_one_b", mistakes=[
    (ORDER_VARIANTS["gpipe"], "GPipe's order"),
    (ORDER_VARIANTS["one_too_many"], "one warm-up forward too many"),
    (ORDER_VARIANTS["reversed"], "the warm-up is reversed")])(one_f_one_b_solution)


# --------------------------------------------------------------------------- build it: a 1F1B executor
def stage_1f1b_solution(stage, inputs, targets, loss_fn, rank, world, num_micro_batches, send, recv):
    """One 1F1B training step of stage ``rank`` of ``world`` (see the notebook's template)."""
    m = num_micro_batches
    warmup = min(world - rank - 1, m)
    saved = []                                       # (input, output) of the micro-batches in flight, oldest first

    def forward(i):
        inp = inputs[i] if rank == 0 else recv(rank - 1).requires_grad_(True)
        out = stage(inp)
        if rank < world - 1:
            send(out, rank + 1)
        else:
            out = loss_fn(out, targets[i]) / m       # the step's loss is the mean over the micro-batches
        saved.append((inp, out))

    def backward():
        inp, out = saved.pop(0)                      # the oldest: gradients come back in the order of the forwards
        if rank < world - 1:
            out.backward(recv(rank + 1))
        else:
            out.backward()                           # adds into .grad: the micro-batches accumulate
        if rank > 0:
            send(inp.grad, rank - 1)

    for i in range(warmup):
        forward(i)
    for i in range(warmup, m):
        forward(i)
        backward()
    for _ in range(warmup):
        backward()


def _executor_variant(kind: str):
    """The solution with one typical mistake: "warmup_plus_one", "not_divided", "not_accumulated", "lifo",
    "float64" (activations sent in double precision)."""
    def step(stage, inputs, targets, loss_fn, rank, world, num_micro_batches, send, recv):
        m = num_micro_batches
        warmup = min(world - rank - (0 if kind == "warmup_plus_one" else 1), m)
        saved = []

        def forward(i):
            inp = inputs[i] if rank == 0 else recv(rank - 1).requires_grad_(True)
            out = stage(inp)
            if rank < world - 1:
                send(out.double() if kind == "float64" else out, rank + 1)
            else:
                out = loss_fn(out, targets[i]) / (1 if kind == "not_divided" else m)
            saved.append((inp, out))

        def backward():
            inp, out = saved.pop() if kind == "lifo" else saved.pop(0)
            if kind == "not_accumulated":
                stage.zero_grad()
            if rank < world - 1:
                out.backward(recv(rank + 1))
            else:
                out.backward()
            if rank > 0:
                send(inp.grad, rank - 1)

        for i in range(warmup):
            forward(i)
        for i in range(warmup, m):
            forward(i)
            backward()
        for _ in range(warmup):
            backward()
    step.__name__ = f"stage_1f1b_{kind}"
    return step


reference("pipeline_1f1b", mistakes=[
    (_executor_variant("warmup_plus_one"), "one warm-up forward too many"),
    (_executor_variant("not_divided"), "m times too large"),
    (_executor_variant("not_accumulated"), "only the last micro-batch's gradient"),
    (_executor_variant("lifo"), "OLDEST saved micro-batch"),
    (_executor_variant("float64"), "in another dtype than the stages compute in")])(stage_1f1b_solution)
