"""Exercises of notebooks/30_sizing_a_layout.ipynb."""
import numpy as np

from ddlcourse.layout import (MIXED, PRESETS, Layout, Model, activation_bytes_per_layer, memory_per_rank,
                              model_state_bytes)
from ddlcourse.selfcheck import Verdict, code_exercise, diagnose

CASES = [(7e9, 64), (70e9, 16), (1.3e9, 8)]


# --------------------------------------------------------------------------- ZeRO's model states
def zero_memory(n_params, replicas, zero):
    """Bytes per rank in mixed precision (bf16 weights and grads, fp32 master weights + Adam m, v):
    return {"params": ..., "grads": ..., "optimizer": ...} for ZeRO stage `zero` over `replicas` ranks."""
    def share(stage):                       # stage 1 shards the optimizer state, 2 also the grads, 3 the params
        return n_params / replicas if zero >= stage else n_params
    return {"params": 2 * share(3), "grads": 2 * share(2), "optimizer": 12 * share(1)}


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


def _off_by_one(n, replicas, zero):
    """Stage z shards what stage z+1 shards (stage 1 already shards the gradients)."""
    return model_state_bytes(n, replicas, min(3, zero + 1) if zero else 0, MIXED)


def _no_master(n, replicas, zero):
    """Adam's two moments only: the fp32 master copy of the weights forgotten (8 bytes, not 12)."""
    d = model_state_bytes(n, replicas, zero, MIXED)
    return {**d, "optimizer": d["optimizer"] * 8 / 12}


def _all_at_once(n, replicas, zero):
    """Every stage > 0 shards everything (stage 3's saving at stage 1)."""
    return model_state_bytes(n, replicas, 3 if zero else 0, MIXED)


@code_exercise("zero_memory", solution=zero_memory, mistakes=[
    (_off_by_one, "one thing too many"), (_no_master, "master weights"),
    (_all_at_once, "stage 1 the optimizer state only")])
def check_zero_memory(fn, **_):
    """``fn(n_params, replicas, zero) -> {"params", "grads", "optimizer"}`` bytes per rank in mixed precision
    (bf16 weights and gradients, fp32 master weights and Adam's two moments), against
    :func:`ddlcourse.layout.model_state_bytes`."""
    return diagnose(_table(fn), _table(_ref), {
        "ZeRO-1 shards only the optimizer state; ZeRO-2 adds the gradients; ZeRO-3 the parameters "
        "(your stages shard one thing too many)": _table(_off_by_one),
        "the optimizer state is 12 bytes per parameter in mixed precision: Adam's m and v *and* the fp32 "
        "master weights (4 + 4 + 4)": _table(_no_master),
        "each stage shards one more thing: stage 1 the optimizer state only, stage 2 also the gradients, "
        "stage 3 also the parameters": _table(_all_at_once),
    }, what="the bytes per rank (params, grads, optimizer) for ZeRO stages 0-3")


# --------------------------------------------------------------------------- build it: the memory of a layout
def memory_per_gpu(model, lay, act_per_layer):
    """Bytes on the busiest GPU (the first pipeline stage) of a dense model in mixed precision (layout.MIXED).

    model: a layout.Model; lay: a layout.Layout; act_per_layer: the activation bytes one layer keeps for one
    micro-batch on this GPU (given: layout.activation_bytes_per_layer(model, lay, 2)).
    Returns {"params", "grads", "optimizer", "activations", "total"} in bytes.
    """
    dense, mlp = model.layer_params()
    layers = model.n_layers // lay.pp                           # the first stage's layers
    held = (layers * (dense + mlp) + model.embedding_params()) / lay.tp
    replicas = lay.dp * lay.cp                                  # the GPUs that hold the same weights

    def share(stage):
        return held / replicas if lay.zero >= stage else held

    mem = {"params": 2 * share(3), "grads": 2 * share(2), "optimizer": 12 * share(1)}
    in_flight = min(lay.pp, lay.n_micro) if lay.pp > 1 else 1   # 1F1B: micro-batches waiting for their backward
    if lay.recompute == "full":
        width = model.dim / lay.tp if lay.sp else model.dim
        kept = layers * lay.micro_batch * model.seq_len / lay.cp * width * 2    # each layer's input, bf16
        mem["activations"] = in_flight * kept + act_per_layer
    else:
        mem["activations"] = in_flight * layers * act_per_layer
    mem["total"] = sum(mem.values())
    return mem


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


def _variant(name, **wrong):
    """:func:`memory_per_gpu` with one typical mistake (``wrong`` names it)."""
    def mem(model, lay, act_per_layer):
        dense, mlp = model.layer_params()
        layers = model.n_layers if wrong.get("no_pp") else model.n_layers // lay.pp
        held = (layers * (dense + mlp) + model.embedding_params()) / (1 if wrong.get("no_tp") else lay.tp)
        replicas = lay.dp if wrong.get("no_cp") else lay.dp * lay.cp
        shift = wrong.get("shift", 0)

        def share(stage):
            if wrong.get("dp_always") and stage == 3:
                return held / replicas
            return held / replicas if lay.zero and lay.zero + shift >= stage else held

        out = {"params": 2 * share(3), "grads": 2 * share(2), "optimizer": 12 * share(1)}
        in_flight = min(lay.pp, lay.n_micro) if lay.pp > 1 and not wrong.get("no_flight") else 1
        if lay.recompute == "full":
            width = model.dim / lay.tp if lay.sp else model.dim
            kept = layers * lay.micro_batch * model.seq_len / lay.cp * width * 2
            out["activations"] = in_flight * kept + act_per_layer
        else:
            out["activations"] = in_flight * layers * act_per_layer
        out["total"] = sum(out.values())
        return out
    mem.__name__ = name
    return mem


_ZERO_SHIFTED = _variant("zero_stage_on_the_wrong_state", shift=1)
_NO_TP = _variant("tp_not_dividing_the_weights", no_tp=True)
_DP_ALWAYS = _variant("dp_dividing_the_weights_without_zero3", dp_always=True)
_NO_CP = _variant("cp_ranks_not_counted_as_replicas", no_cp=True)
_NO_FLIGHT = _variant("one_micro_batch_in_flight", no_flight=True)
_NO_PP = _variant("every_layer_on_every_stage", no_pp=True)

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


@code_exercise("layout_memory", solution=memory_per_gpu, mistakes=[
    (_ZERO_SHIFTED, "ZeRO stage applied to the wrong state"), (_NO_TP, "tp does not divide the weights"),
    (_DP_ALWAYS, "dp divides the weights without ZeRO-3"), (_NO_CP, "context-parallel ranks are not counted"),
    (_NO_FLIGHT, "one micro-batch in flight"), (_NO_PP, "pp does not divide the layers")])
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
    v_ = diagnose(ans, ref, {LAYOUT_HINTS["zero"]: _layout_table(_ZERO_SHIFTED),
                             LAYOUT_HINTS["tp"]: _layout_table(_NO_TP),
                             LAYOUT_HINTS["dp"]: _layout_table(_DP_ALWAYS),
                             LAYOUT_HINTS["cp"]: _layout_table(_NO_CP),
                             LAYOUT_HINTS["flight"]: _layout_table(_NO_FLIGHT),
                             LAYOUT_HINTS["pp"]: _layout_table(_NO_PP)},
                  rtol=1e-9, atol=1e-3, what="the bytes per GPU")
    if v_.ok or ans.shape != ref.shape or v_.message in LAYOUT_HINTS.values():
        return v_
    bad = ~np.isclose(ans, ref, rtol=1e-9, atol=1e-3)
    i, j = np.argwhere(bad)[0]
    model, lay = LAYOUT_CASES[i]
    which = "7B" if model == PRESETS["7B"] else "70B" if model == PRESETS["70B"] else "a small model"
    return Verdict(False, f"{v_.message}; first for {which} with {_describe(lay)}: {KEYS[j]} is "
                          f"{ans[i, j]:,.0f} bytes, expected {ref[i, j]:,.0f}")
