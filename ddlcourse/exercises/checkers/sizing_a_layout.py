"""Checkers of notebooks/30_sizing_a_layout.ipynb: ZeRO's model states, and the memory of a layout on its busiest GPU
that the learner builds, against the package's layout model."""
import numpy as np

from ddlcourse.exercises.solutions.sizing_a_layout import LAYOUT_VARIANTS, ZERO_VARIANTS
from ddlcourse.layout import (MIXED, PRESETS, Layout, Model, activation_bytes_per_layer, memory_per_rank,
                              model_state_bytes)
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

CASES = [(7e9, 64), (70e9, 16), (1.3e9, 8)]


# --------------------------------------------------------------------------- ZeRO's model states
def _table(fn):
    """(params, grads, optimizer) bytes for every case and ZeRO stage 0..3, as one array."""
    out = []
    for n, replicas in CASES:
        for z in (0, 1, 2, 3):
            d = fn(n, replicas, z)
            out.append([float(d["params"]), float(d["grads"]), float(d["optimizer"])])
    return np.array(out)


def _ref(n, replicas, zero):
    return model_state_bytes(n, replicas, zero, MIXED)


ZERO_HINTS = {
    "off_by_one": "ZeRO-1 shards only the optimizer state; ZeRO-2 adds the gradients; ZeRO-3 the parameters "
                  "(your stages shard one thing too many)",
    "no_master": "the optimizer state is 12 bytes per parameter in mixed precision: Adam's m and v *and* the fp32 "
                 "master weights (4 + 4 + 4)",
    "all_at_once": "each stage shards one more thing: stage 1 the optimizer state only, stage 2 also the gradients, "
                   "stage 3 also the parameters",
}


@code_exercise("zero_memory")
def check_zero_memory(fn, **_):
    """``fn(n_params, replicas, zero) -> {"params", "grads", "optimizer"}`` bytes per rank in mixed precision
    (bf16 weights and gradients, fp32 master weights and Adam's two moments), against
    :func:`ddlcourse.layout.model_state_bytes`."""
    wrong = {hint: _table(ZERO_VARIANTS[kind]) for kind, hint in ZERO_HINTS.items()}
    return diagnose(_table(fn), _table(_ref), wrong,
                    what="the bytes per rank (params, grads, optimizer) for ZeRO stages 0-3")


# --------------------------------------------------------------------------- build it: the memory of a layout
_SMALL = Model(n_layers=4, dim=64, n_heads=4, vocab=100, seq_len=32, ffn=256)
LAYOUT_CASES = [
    (PRESETS["7B"], Layout(dp=64, tp=8, sp=True, zero=1, n_micro=16)),
    (PRESETS["7B"], Layout(dp=16, tp=8, pp=4, sp=True, zero=1, n_micro=64)),
    (PRESETS["7B"], Layout(dp=128, tp=4, zero=2, n_micro=8)),
    (PRESETS["70B"], Layout(dp=32, tp=8, cp=2, sp=True, zero=3, recompute="full", n_micro=2)),
    (PRESETS["70B"], Layout(dp=8, tp=8, pp=4, cp=2, sp=True, zero=1, recompute="selective", n_micro=8)),
    (PRESETS["70B"], Layout(dp=16, tp=8, pp=4, sp=True, zero=1, recompute="full", n_micro=64)),
    (_SMALL, Layout(dp=2, cp=2, zero=1, micro_batch=2)),
    (_SMALL, Layout(dp=4)),
    (_SMALL, Layout(dp=2, tp=2, pp=2, zero=1, recompute="full", n_micro=4)),
    (_SMALL, Layout(dp=4, tp=2, zero=3, recompute="full", n_micro=4)),
]
KEYS = ("params", "grads", "optimizer", "activations", "total")


def _reference(model, lay, act_per_layer):
    return memory_per_rank(model, lay, MIXED)


LAYOUT_HINTS = {
    "zero": "ZeRO stage applied to the wrong state: stage 1 shards the optimizer state only, stage 2 also the "
            "gradients, stage 3 also the weights",
    "tp": "tp does not divide the weights: tensor parallelism gives each GPU 1/tp of every layer's matrices "
          "(and of the embeddings, as layout counts them)",
    "dp": "dp divides the weights without ZeRO-3: every data-parallel replica holds the whole weights unless "
          "lay.zero == 3",
    "cp": "the context-parallel ranks are not counted as replicas: the dp * cp ranks of a (tp, pp) position "
          "hold the same weights, so ZeRO shards over dp * cp",
    "flight": "one micro-batch in flight: with a pipeline (1F1B) the first stage keeps min(pp, n_micro) "
              "micro-batches' activations",
    "pp": "pp does not divide the layers: the first stage holds n_layers // pp of them",
}


def _layout_table(fn):
    rows = []
    for model, lay in LAYOUT_CASES:
        got = fn(model, lay, activation_bytes_per_layer(model, lay, MIXED.act))
        missing = [k for k in KEYS if k not in got] if isinstance(got, dict) else list(KEYS)
        if missing:
            raise KeyError(f"return a dict with the keys {', '.join(KEYS)}; missing {', '.join(missing)}")
        rows.append([float(got[k]) for k in KEYS])
    return np.array(rows)


def _describe(lay):
    parts = [f"{k}={getattr(lay, k)}" for k in ("dp", "tp", "pp", "cp", "zero", "n_micro") if getattr(lay, k) != 1]
    parts += [f"recompute={lay.recompute!r}"] if lay.recompute != "none" else []
    parts += ["sp=True"] if lay.sp else []
    return "Layout(" + ", ".join(parts) + ")"


@code_exercise("layout_memory")
def check_layout_memory(fn, **_):
    """``fn(model, lay, act_per_layer)`` against :func:`ddlcourse.layout.memory_per_rank` (mixed precision) on
    the 7B and 70B presets and a small model, over layouts that use every parallelism, ZeRO stage and
    recomputation."""
    try:
        ans = _layout_table(fn)
    except KeyError as e:
        if "return a dict" in str(e):
            return Verdict(False, str(e.args[0]))
        raise
    ref = _layout_table(_reference)
    v_ = diagnose(ans, ref, {hint: _layout_table(LAYOUT_VARIANTS[kind]) for kind, hint in LAYOUT_HINTS.items()},
                  rtol=1e-9, atol=1e-3, what="the bytes per GPU")
    if v_.ok or ans.shape != ref.shape or v_.message in LAYOUT_HINTS.values():
        return v_
    bad = ~np.isclose(ans, ref, rtol=1e-9, atol=1e-3)
    i, j = np.argwhere(bad)[0]
    model, lay = LAYOUT_CASES[i]
    which = "7B" if model == PRESETS["7B"] else "70B" if model == PRESETS["70B"] else "a small model"
    return Verdict(False, f"{v_.message}; first for {which} with {_describe(lay)}: {KEYS[j]} is "
                          f"{ans[i, j]:,.0f} bytes, expected {ref[i, j]:,.0f}")
