"""Checkers of notebooks/17_pipeline_schedules.ipynb: the checkers of the interleaved 1F1B order of one rank (against
the package's order of torch's schedule) and of the zero-bubble split of a backward pass into B (the input gradient)
and a deferred W (the weight gradients), against autograd."""
import numpy as np
import torch

from ddlcourse.exercises.solutions.pipeline_schedules import mistake
from ddlcourse.parallel.pipeline_schedules import interleaved_order
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, order_verdict

CASES = [(r, p, m, v) for p, m, v in ((2, 4, 2), (4, 8, 2), (4, 4, 2), (3, 6, 3), (2, 2, 2)) for r in range(p)]


ORDER_HINTS = {
    "gpipe": "that runs every forward before the first backward (GPipe's order, or looped BFS): start the "
             "backwards after the warm-up, then alternate one forward and one backward",
    "plain_1f1b_warmup": "that is the warm-up of plain 1F1B (p - rank - 1): with v stages per rank the rank "
                         "first runs (v - 1) * p forwards to fill its later stages, plus 2 * (p - 1 - rank)",
    "no_extra_rounds": "the warm-up misses the (v - 1) * p forwards that fill the rank's later stages before the "
                       "first backward can come back",
    "off_by_one": "one warm-up forward too many: (v - 1) * p + 2 * (p - 1 - rank), capped at v * m",
    "same_direction": "the backwards visit the rank's stages in the forward direction: the gradient comes back "
                      "through the last stage first, so backwards start on stage rank + (v - 1) * p",
}



def _as_ops(order) -> list[str]:
    return [f"{str(k).upper()}{int(s)}.{int(mb)}" for k, s, mb in order]


@code_exercise("interleaved_order")
def check_interleaved_order(fn, **_) -> Verdict:
    """``fn(rank, num_ranks, num_micro_batches, stages_per_rank) -> [("F" | "B", stage, micro_batch), ...]``
    against :func:`ddlcourse.parallel.pipeline_schedules.interleaved_order` (the order of torch's
    ``ScheduleInterleaved1F1B``) for several ranks, rank counts, micro-batch counts and stages per rank."""
    for r, p, m, v in CASES:
        verdict = order_verdict(_as_ops(fn(r, p, m, v)), _as_ops(interleaved_order(r, p, m, v)),
                                f"rank {r} of {p}, {m} micro-batches, {v} stages per rank",
                                [(_as_ops(mistake(kind)(r, p, m, v)), hint) for kind, hint in ORDER_HINTS.items()],
                                "each of the rank's stages needs one F and one B per micro-batch")
        if verdict is not None:
            return verdict
    return Verdict(True)


# --------------------------------------------------------------------------- build it: split the backward in B and W
SPLIT_HINTS = {
    "transposed": "the transposes are swapped: a weight W is (out, in), so dL/dW = grad_out.T @ input is "
                  "(out, in) and dL/dx = grad_out @ W",
    "from_output": "a weight gradient was computed from the layer's output: dL/dW needs the layer's INPUT, the "
                   "one saved at the forward (x for the first layer, relu(h) for the second)",
    "bias_axis": "a bias gradient is summed over the wrong axis: sum grad_out over the batch (axis 0), which "
                 "gives one number per output feature",
    "latest": "backward_weight took the wrong micro-batch: the W of a micro-batch comes after its B, oldest "
              "first (keep a first-in, first-out queue)",
    "mask": "the ReLU lets the gradient through only where h > 0: multiply grad_out @ w2 by (h > 0)",
}
DIMS, SPLIT_ROWS = (6, 9, 4), (3, 5, 2)          # in, hidden, out; the rows of three micro-batches
PARAM_NAMES = ("dL/dw1", "dL/db1", "dL/dw2", "dL/db2")


def _split_case():
    gen = torch.Generator().manual_seed(11)
    d_in, d_h, d_out = DIMS
    params = [torch.randn(d_h, d_in, generator=gen), torch.randn(d_h, generator=gen),
              torch.randn(d_out, d_h, generator=gen), torch.randn(d_out, generator=gen)]
    xs = [torch.randn(n, d_in, generator=gen) for n in SPLIT_ROWS]
    gs = [torch.randn(n, d_out, generator=gen) for n in SPLIT_ROWS]
    refs = []                                      # per micro-batch: y, dx, (dw1, db1, dw2, db2), the parts
    for x, g in zip(xs, gs):
        leaves = [t.clone().requires_grad_(True) for t in [x] + params]
        h = leaves[0] @ leaves[1].T + leaves[2]
        y = torch.relu(h) @ leaves[3].T + leaves[4]
        grads = torch.autograd.grad(y, leaves, g)
        grad_h = ((g @ params[2]) * (h > 0)).detach()
        parts = dict(x=x, h=h.detach(), a=torch.relu(h).detach(), y=y.detach(), g=g, grad_h=grad_h)
        refs.append((y.detach(), grads[0], grads[1:], parts))
    return params, xs, gs, refs


def _weight_mistakes(k: int, refs) -> dict:
    """What each typical mistake returns for parameter ``k`` of micro-batch ``j``'s W."""
    out = {}
    for j, (_, _, grads, q) in enumerate(refs):
        grad, inp, outp = (q["grad_h"], q["x"], q["h"]) if k < 2 else (q["g"], q["a"], q["y"])
        if k % 2 == 0:
            out.setdefault(SPLIT_HINTS["transposed"], []).append(inp.T @ grad)
            out.setdefault(SPLIT_HINTS["from_output"], []).extend([grad.T @ outp, grad.T @ q["h"]] if k == 2
                                                                  else [grad.T @ outp, grad.T @ q["a"]])
        else:
            out.setdefault(SPLIT_HINTS["bias_axis"], []).extend([grad.sum(1), grad.sum()])
    return out


@code_exercise("zero_bubble_split", distributed=False)
def check_zero_bubble_split(fn, **_) -> Verdict:
    """``fn(w1, b1, w2, b2)`` builds the learner's two-layer MLP with ``forward(x)``, ``backward_input(grad_out)``
    (returns dL/dx of the oldest micro-batch without its B) and ``backward_weight()`` (returns
    ``(dw1, db1, dw2, db2)`` of the oldest micro-batch without its W). Three micro-batches of different sizes run
    in a zero-bubble order, F F F B B W B W W, each result against autograd's."""
    params, xs, gs, refs = _split_case()
    layer = fn(*[t.clone() for t in params])

    def close(a, b):
        return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)

    for i, x in enumerate(xs):
        y = layer.forward(x.clone())
        if not close(y, refs[i][0]):
            return Verdict(False, f"forward of micro-batch {i}: the output is not relu(x @ w1.T + b1) @ w2.T + b2")
    n_b = n_w = 0
    for op in "BBWBWW":
        if op == "B":
            try:
                dx = layer.backward_input(gs[n_b].clone())
            except RuntimeError as e:
                if "shape" in str(e) or "size" in str(e):
                    return Verdict(False, f"backward_input raised {e}: {SPLIT_HINTS['transposed']}")
                raise
            ref_dx, q = refs[n_b][1], refs[n_b][3]
            if not close(dx, ref_dx):
                if close(dx, (q["g"] @ params[2]) @ params[0]):
                    return Verdict(False, f"dL/dx of micro-batch {n_b}: {SPLIT_HINTS['mask']}")
                v = diagnose(dx, ref_dx, {}, what=f"dL/dx of micro-batch {n_b}")
                return Verdict(False, v.message or f"dL/dx of micro-batch {n_b} differs from autograd's")
            n_b += 1
            continue
        got = layer.backward_weight()
        if not isinstance(got, (tuple, list)) or len(got) != 4:
            return Verdict(False, "backward_weight returns the 4 gradients (dw1, db1, dw2, db2) of one micro-batch")
        for k, (g, ref) in enumerate(zip(got, refs[n_w][2])):
            if close(g, ref):
                continue
            where = f"{PARAM_NAMES[k]} of micro-batch {n_w}"
            if any(close(g, refs[j][2][k]) for j in range(len(refs)) if j != n_w):
                return Verdict(False, f"{where}: {SPLIT_HINTS['latest']}")
            for hint, wrongs in _weight_mistakes(k, [refs[n_w]]).items():
                if any(close(g, w) for w in wrongs):
                    return Verdict(False, f"{where}: {hint}")
            return diagnose(np.asarray(g.detach(), dtype=float) if isinstance(g, torch.Tensor) else g,
                            np.asarray(ref, dtype=float), {}, what=where)
        n_w += 1
    return Verdict(True)
