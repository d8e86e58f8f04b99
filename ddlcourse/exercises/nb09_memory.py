"""Exercises of notebooks/09_memory.ipynb."""
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose, exercise


@exercise("adam_state_gib", "fp32 Adam: 4 bytes of weights + 4 of gradients + 8 of moments per parameter; 1 GiB = 2**30 bytes")
def adam_state_gib(n_params: float) -> float:
    return 16 * n_params / 2**30


@exercise("activation_mib", "batch * channels * side**3 values, 4 bytes each; 1 MiB = 2**20 bytes")
def activation_mib(channels: int, side: int, batch: int) -> float:
    return batch * channels * side**3 * 4 / 2**20


# --------------------------------------------------------------------------- coding exercise: bytes of training state
def _state_variant(kind: str):
    from ddlcourse.memory import OPT_STATE_PER_PARAM

    def state(n_params, optimizer):
        k = OPT_STATE_PER_PARAM[optimizer]
        if kind == "no_grads":
            return 4 * n_params * (1 + k)
        if kind == "elements":
            return n_params * (2 + k)
        if kind == "adam_one":                        # Adam counted with one moment
            return 4 * n_params * (2 + min(k, 1))
        raise ValueError(kind)
    return state


@code_exercise("training_state_bytes", distributed=False)
def check_training_state_bytes(fn, **_) -> Verdict:
    """``fn(n_params, optimizer) -> bytes`` of parameters + gradients + optimizer state in fp32, for
    ``optimizer`` in sgd, momentum, adam; against ``memory.predict`` on real models of several sizes."""
    import torch

    from ddlcourse import memory
    cases = [(memory.mlp(8, h, d), opt) for h, d in ((16, 2), (64, 3)) for opt in ("sgd", "momentum", "adam")]
    x = torch.zeros(2, 8)
    ans, ref, mis = [], [], {}
    for model, opt in cases:
        P = memory.n_params(model)
        pr = memory.predict(model, x, opt)
        ans.append(float(fn(P, opt)))
        ref.append(float(pr["params"] + pr["grads"] + pr["optimizer"]))
    hints = {
        "you left out the gradients: backward stores one fp32 gradient per parameter (4 bytes)": "no_grads",
        "you counted numbers, not bytes: each fp32 value takes 4 bytes": "elements",
        "Adam keeps two moments per parameter (m and v), not one": "adam_one",
    }
    for hint, kind in hints.items():
        mis[hint] = [float(_state_variant(kind)(memory.n_params(m), o)) for m, o in cases]
    return diagnose(ans, ref, mis, rtol=0, atol=0.5, what="bytes for (model, optimizer) cases")
