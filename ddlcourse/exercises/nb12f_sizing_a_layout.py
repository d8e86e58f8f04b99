"""Exercises of notebooks/12f_sizing_a_layout.ipynb."""
import numpy as np

from ddlcourse.layout import MIXED, model_state_bytes
from ddlcourse.selfcheck import code_exercise, diagnose

CASES = [(7e9, 64), (70e9, 16), (1.3e9, 8)]


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


@code_exercise("zero_memory")
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
