"""Reference solutions of notebooks/14_memory.ipynb: the bytes of training state and activation checkpointing by hand
as a learner writes them, and each with typical mistakes (what their checkers,
:mod:`ddlcourse.exercises.checkers.memory`, must name)."""
import torch
import torch.utils.checkpoint

from ddlcourse.memory import OPT_STATE_PER_PARAM
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- coding exercise: bytes of training state
def _state_variant(kind: str):
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


STATE_VARIANTS = {kind: _state_variant(kind) for kind in ("no_grads", "elements", "adam_one")}


@reference("training_state_bytes", mistakes=[
    (STATE_VARIANTS["no_grads"], "you left out the gradients"),
    (STATE_VARIANTS["elements"], "not bytes"),
    (STATE_VARIANTS["adam_one"], "two moments"),
])
def training_state_bytes(n_params, optimizer):
    """Bytes of fp32 parameters + gradients + optimizer state for `optimizer` in {"sgd", "momentum", "adam"}."""
    moments = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]     # fp32 tensors of the parameters' size
    return 4 * n_params * (2 + moments)                            # weights + gradients + moments, 4 bytes each


# --------------------------------------------------------------------------- build it: activation checkpointing
def checkpointed_forward(layers, x, segments):
    """Run the ``nn.Sequential`` ``layers`` on ``x`` (batch, dim) in ``segments`` chunks of consecutive layers,
    chunk k = layers ``k * L // segments`` to ``(k + 1) * L // segments - 1`` (L = len(layers)), each chunk under
    activation checkpointing: only its input is kept, its inside is recomputed during backward. Returns the output."""
    n = len(layers)
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be between 1 and {n}, got {segments}")
    bounds = [k * n // segments for k in range(segments + 1)]

    def run(start, stop):                       # the forward of one chunk, as a function of its input
        def chunk(h):
            for layer in layers[start:stop]:
                h = layer(h)
            return h
        return chunk

    h = x
    for start, stop in zip(bounds[:-1], bounds[1:]):
        # keep only h; backward calls chunk(h) again to rebuild what it needs
        h = torch.utils.checkpoint.checkpoint(run(start, stop), h, use_reentrant=False)
    return h


def _ck_chunks(n, segments, rule):
    if rule == "torch":                         # checkpoint_sequential's split: L // S each, the rest to the last
        size = n // segments
        return [k * size for k in range(segments)] + [n]
    return [k * n // segments for k in range(segments + 1)]


def _ck_variant(kind):
    """checkpointed_forward with one typical mistake: "plain" (no checkpoint), "torch" (other chunk boundaries),
    "detach" (each chunk's input detached), "last_plain" (the last chunk run without checkpointing)."""
    def forward(layers, x, segments):
        if kind == "plain":
            return layers(x)
        bounds = _ck_chunks(len(layers), segments, "torch" if kind == "torch" else "even")
        h = x
        for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
            chunk = layers[start:stop]
            if kind == "detach":
                h = h.detach()
            if kind == "last_plain" and i == segments - 1:
                h = chunk(h)
            else:
                h = torch.utils.checkpoint.checkpoint(chunk, h, use_reentrant=False)
        return h
    forward.__name__ = f"checkpointed_forward_{kind}"
    return forward


reference("checkpointed_forward", mistakes=[
    (_ck_variant("plain"), "no recompute"),
    (_ck_variant("torch"), "segment boundaries"),
    (_ck_variant("detach"), "detach"),
    (_ck_variant("last_plain"), "last segment"),
])(checkpointed_forward)
