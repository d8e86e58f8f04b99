"""Checkers of notebooks/14_memory.ipynb: the reference answers of its questions, and the checkers of the bytes of
training state and of activation checkpointing by hand (measured with saved_tensors_hooks) the learner writes."""
import torch

from ddlcourse import memory
from ddlcourse.exercises.solutions.memory import STATE_VARIANTS
from ddlcourse.memory import SavedTensors
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("adam_state_gib", "fp32 Adam: 4 bytes of weights + 4 of gradients + 8 of moments per parameter; 1 GiB = 2**30 bytes")
def adam_state_gib(n_params: float) -> float:
    return 16 * n_params / 2**30


@exercise("activation_mib", "batch * channels * side**3 values, 4 bytes each; 1 MiB = 2**20 bytes")
def activation_mib(channels: int, side: int, batch: int) -> float:
    return batch * channels * side**3 * 4 / 2**20


# --------------------------------------------------------------------------- coding exercise: bytes of training state
STATE_HINTS = {
    "no_grads": "you left out the gradients: backward stores one fp32 gradient per parameter (4 bytes)",
    "elements": "you counted numbers, not bytes: each fp32 value takes 4 bytes",
    "adam_one": "Adam keeps two moments per parameter (m and v), not one",
}


@code_exercise("training_state_bytes", distributed=False)
def check_training_state_bytes(fn, **_) -> Verdict:
    """``fn(n_params, optimizer) -> bytes`` of parameters + gradients + optimizer state in fp32, for
    ``optimizer`` in sgd, momentum, adam; against ``memory.predict`` on real models of several sizes."""
    import torch

    cases = [(memory.mlp(8, h, d), opt) for h, d in ((16, 2), (64, 3)) for opt in ("sgd", "momentum", "adam")]
    x = torch.zeros(2, 8)
    ans, ref, mis = [], [], {}
    for model, opt in cases:
        P = memory.n_params(model)
        pr = memory.predict(model, x, opt)
        ans.append(float(fn(P, opt)))
        ref.append(float(pr["params"] + pr["grads"] + pr["optimizer"]))
    for kind, hint in STATE_HINTS.items():
        mis[hint] = [float(STATE_VARIANTS[kind](memory.n_params(m), o)) for m, o in cases]
    return diagnose(ans, ref, mis, rtol=0, atol=0.5, what="bytes for (model, optimizer) cases")


# --------------------------------------------------------------------------- build it: activation checkpointing
def _ck_model(n_layers, width=16, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(n_layers // 2):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _ck_run(fn, n_layers, segments, batch=6, width=16):
    """Run ``fn`` on a fresh model: output, parameter gradients, bytes saved for backward during the forward
    (parameters and the input left out), the layers run during backward (recomputation) and a backward error."""
    model = _ck_model(n_layers, width)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    saved, log = SavedTensors(skip=[*model.parameters(), x]), []
    hooks = [m.register_forward_pre_hook(lambda _m, _i, i=i: log.append(i)) for i, m in enumerate(model)]
    try:
        with saved:
            out = fn(model, x, segments)
        log.clear()
        loss = (out.float() ** 2).sum()
        error = None
        try:
            loss.backward()
        except RuntimeError as e:
            error = str(e)
    finally:
        for h in hooks:
            h.remove()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return dict(out=out.detach(), grads=grads, saved=saved.bytes, log=list(log), error=error,
                boundary_bytes=batch * width * 4)


# (layers, segments): the split rules differ (8 layers in 3: 2+3+3, not 2+2+4; 6 in 4: 1+2+1+2)
_CK_CASES = [(8, 3), (6, 4)]


@code_exercise("checkpointed_forward", distributed=False)
def check_checkpointed_forward(fn, **_) -> Verdict:
    """``fn(layers, x, segments)``: same output and gradients as ``layers(x)``; during forward autograd keeps only
    the chunks' boundaries (measured with ``saved_tensors_hooks``); backward recomputes every chunk, last one first."""
    for n_layers, segments in _CK_CASES:
        where = f"{n_layers} layers in {segments} segments"
        got = _ck_run(fn, n_layers, segments)
        ref = _ck_run(lambda layers, x, s: layers(x), n_layers, segments)
        if tuple(got["out"].shape) != tuple(ref["out"].shape) or not torch.allclose(got["out"], ref["out"], atol=1e-6):
            return Verdict(False, f"{where}: the output differs from the plain model's: run every layer once, in "
                                  "order (segment k ends where segment k + 1 starts)")
        missing = [i for i, (g, r) in enumerate(zip(got["grads"], ref["grads"])) if g is None or not torch.allclose(g, r, atol=1e-6)]
        if got["error"] or missing:
            return Verdict(False, f"{where}: no gradient reaches the layers before the last segment (or a wrong one): "
                                  "do not detach a segment's input; with use_reentrant=True the input must require "
                                  "grad, use_reentrant=False does not need it" + (f" ({got['error']})" if got["error"] else ""))
        bounds = [k * n_layers // segments for k in range(segments + 1)]     # segment k starts at layer k*L//S
        expect = [i for a, b in reversed(list(zip(bounds[:-1], bounds[1:]))) for i in range(a, b)]
        bound = (segments - 1) * got["boundary_bytes"]
        if not got["log"]:
            return Verdict(False, f"{where}: no recompute: backward ran no layer again, so the forward kept every "
                                  f"layer's activations ({got['saved']} bytes; the boundaries take {bound}). Run "
                                  "each segment under torch.utils.checkpoint.checkpoint")
        last = list(range(bounds[-2], bounds[-1]))
        if got["log"] == expect[len(last):]:
            return Verdict(False, f"{where}: the last segment ran without checkpointing (its activations were kept): "
                                  "checkpoint every segment, the last one too")
        if got["log"] != expect:
            return Verdict(False, f"{where}: segment boundaries: segment k holds layers k*L//segments to "
                                  f"(k+1)*L//segments - 1; backward recomputed layers {got['log']}, expected {expect} "
                                  "(the last segment first)")
        if got["saved"] > bound:
            return Verdict(False, f"{where}: the forward kept {got['saved']} bytes for backward, more than the "
                                  f"{segments - 1} segment boundaries ({bound} bytes): no recompute of some layers")
    return Verdict(True)
