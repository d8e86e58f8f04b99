"""Reference solutions of notebooks/30_sizing_a_layout.ipynb: ZeRO's model states, and the memory of a layout on its
busiest GPU; each with typical mistakes (what :mod:`ddlcourse.exercises.checkers.sizing_a_layout` must name)."""
from ddlcourse.layout import MIXED, model_state_bytes
from ddlcourse.selfcheck import reference


# --------------------------------------------------------------------------- ZeRO's model states
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


ZERO_VARIANTS = {"off_by_one": _off_by_one, "no_master": _no_master, "all_at_once": _all_at_once}


@reference("zero_memory", mistakes=[
    (_off_by_one, "one thing too many"), (_no_master, "master weights"),
    (_all_at_once, "stage 1 the optimizer state only")])
def zero_memory(n_params, replicas, zero):
    """Bytes per rank in mixed precision (bf16 weights and grads, fp32 master weights + Adam m, v):
    return {"params": ..., "grads": ..., "optimizer": ...} for ZeRO stage `zero` over `replicas` ranks."""
    def share(stage):                       # stage 1 shards the optimizer state, 2 also the grads, 3 the params
        return n_params / replicas if zero >= stage else n_params
    return {"params": 2 * share(3), "grads": 2 * share(2), "optimizer": 12 * share(1)}


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

LAYOUT_VARIANTS = {"zero": _ZERO_SHIFTED, "tp": _NO_TP, "dp": _DP_ALWAYS, "cp": _NO_CP, "flight": _NO_FLIGHT,
                   "pp": _NO_PP}

reference("layout_memory", mistakes=[
    (_ZERO_SHIFTED, "ZeRO stage applied to the wrong state"), (_NO_TP, "tp does not divide the weights"),
    (_DP_ALWAYS, "dp divides the weights without ZeRO-3"), (_NO_CP, "context-parallel ranks are not counted"),
    (_NO_FLIGHT, "one micro-batch in flight"), (_NO_PP, "pp does not divide the layers")])(memory_per_gpu)
