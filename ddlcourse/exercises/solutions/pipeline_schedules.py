"""Reference solutions of notebooks/17_pipeline_schedules.ipynb: the interleaved 1F1B order of one rank and the
zero-bubble split of a backward pass as a learner writes them, and each with one typical mistake (what their
checkers, :mod:`ddlcourse.exercises.checkers.pipeline_schedules`, must name)."""
import torch

from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: the interleaved order
def _variant(rank, p, m, v, warmup=None, reverse_backward=True, gpipe=False):
    """The interleaved order with one thing changed (the typical mistakes of the exercise)."""
    total = v * m
    if gpipe:
        warmup = total
    elif warmup is None:
        warmup = (v - 1) * p + 2 * (p - 1 - rank)
    warmup = max(0, min(warmup, total))

    def nth(k, backward):
        chunk = (k // p) % v
        if backward and reverse_backward:
            chunk = v - 1 - chunk
        return rank + chunk * p, (k // (p * v)) * p + k % p

    order = [("F", *nth(k, False)) for k in range(warmup)]
    for k in range(warmup, total):
        order += [("F", *nth(k, False)), ("B", *nth(k - warmup, True))]
    return order + [("B", *nth(k, True)) for k in range(total - warmup, total)]


VARIANT_OPTIONS = {
    "gpipe": dict(gpipe=True),
    "plain_1f1b_warmup": dict(warmup="plain"),
    "no_extra_rounds": dict(warmup="no_rounds"),
    "off_by_one": dict(warmup="plus_one"),
    "same_direction": dict(reverse_backward=False),
}


def mistake(kind: str):
    """``fn(rank, p, m, v)`` making the mistake ``kind`` of :data:`VARIANT_OPTIONS` (for the checker, tests and
    demos)."""
    opts = dict(VARIANT_OPTIONS[kind])
    w = opts.pop("warmup", None)

    def fn(rank, p, m, v):
        warm = {None: None, "plain": p - rank - 1, "no_rounds": 2 * (p - 1 - rank),
                "plus_one": (v - 1) * p + 2 * (p - 1 - rank) + 1}[w]
        return _variant(rank, p, m, v, warmup=warm, **opts)
    return fn


def _named(kind):
    fn = mistake(kind)
    fn.__name__ = f"interleaved_order_{kind}"
    return fn


# the hint fragments: the first 45 characters of the checker's ORDER_HINTS
@reference("interleaved_order", mistakes=[
    (_named("gpipe"), "that runs every forward before the first back"),
    (_named("plain_1f1b_warmup"), "that is the warm-up of plain 1F1B (p - rank -"),
    (_named("off_by_one"), "one warm-up forward too many: (v - 1) * p + 2"),
    (_named("same_direction"), "the backwards visit the rank's stages in the ")])
def interleaved_order_solution(rank, num_ranks, num_micro_batches, stages_per_rank):
    """The interleaved 1F1B order of ``rank``: a list of ("F", stage, micro_batch) and ("B", stage, micro_batch)."""
    p, m, v = num_ranks, num_micro_batches, stages_per_rank
    total = v * m

    def nth(k, backward):                              # the rank's k-th forward (or backward)
        chunk = (k // p) % v                           # rounds of p micro-batches per stage of the rank
        if backward:
            chunk = v - 1 - chunk                      # backwards visit the rank's stages in reverse
        return rank + chunk * p, (k // (p * v)) * p + k % p

    warmup = min((v - 1) * p + 2 * (p - 1 - rank), total)
    order = [("F", *nth(k, False)) for k in range(warmup)]
    for k in range(warmup, total):
        order += [("F", *nth(k, False)), ("B", *nth(k - warmup, True))]
    return order + [("B", *nth(k, True)) for k in range(total - warmup, total)]


# --------------------------------------------------------------------------- build it: split the backward in B and W
class SplitBackwardMLP:
    """y = relu(x @ w1.T + b1) @ w2.T + b2 with the backward split as a zero-bubble schedule does."""

    def __init__(self, w1, b1, w2, b2):
        self.params = (w1, b1, w2, b2)
        self.saved = []            # per micro-batch, from its forward: (x, h)
        self.pending = []          # per micro-batch, after its B: what its W needs

    def forward(self, x):
        w1, b1, w2, b2 = self.params
        h = x @ w1.T + b1
        self.saved.append((x, h))
        return torch.relu(h) @ w2.T + b2

    def backward_input(self, grad_out):
        w1, _, w2, _ = self.params
        x, h = self.saved.pop(0)                       # the oldest micro-batch without its B
        grad_h = (grad_out @ w2) * (h > 0)
        self.pending.append((x, grad_h, torch.relu(h), grad_out))
        return grad_h @ w1

    def backward_weight(self):
        x, grad_h, a, grad_out = self.pending.pop(0)   # the oldest micro-batch without its W
        return grad_h.T @ x, grad_h.sum(0), grad_out.T @ a, grad_out.sum(0)


def _split_variant(kind: str):
    """The solution with one typical mistake: "transposed", "from_output", "bias_axis", "latest"."""
    class Variant(SplitBackwardMLP):
        def forward(self, x):
            y = super().forward(x)
            self.outputs = getattr(self, "outputs", []) + [y]
            return y

        def backward_input(self, grad_out):
            grad_x = super().backward_input(grad_out)
            self.pending[-1] += (self.outputs.pop(0),)
            return grad_x

        def backward_weight(self):
            x, grad_h, a, grad_out, y = self.pending.pop(-1 if kind == "latest" else 0)
            if kind == "transposed":
                return x.T @ grad_h, grad_h.sum(0), a.T @ grad_out, grad_out.sum(0)
            if kind == "from_output":
                return grad_h.T @ x, grad_h.sum(0), grad_out.T @ y, grad_out.sum(0)
            if kind == "bias_axis":
                return grad_h.T @ x, grad_h.sum(1), grad_out.T @ a, grad_out.sum(1)
            return grad_h.T @ x, grad_h.sum(0), grad_out.T @ a, grad_out.sum(0)
    Variant.__name__ = f"SplitBackwardMLP_{kind}"
    return Variant


reference("zero_bubble_split", mistakes=[
    (_split_variant("transposed"), "the transposes are swapped"),
    (_split_variant("from_output"), "computed from the layer's output"),
    (_split_variant("bias_axis"), "summed over the wrong axis"),
    (_split_variant("latest"), "took the wrong micro-batch")])(SplitBackwardMLP)
