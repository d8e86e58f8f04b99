"""Tensor parallelism (Megatron) and sequence parallelism of a transformer block, hand-written and with DTensor,
against the serial block and model on 2 and 4 ranks; the layout calculator's activation and byte formulas
(``tp``, ``sp``) against what the ranks measure."""
import json

import pytest
import torch

from ddlcourse import layout
from ddlcourse.models import transformer as T
from ddlcourse.parallel import sequence
from ddlcourse.experiments import sequence as sequence_exp

from helpers import run_ranks

CFG = dict(vocab=11, seq_len=16, dim=32, n_heads=4, n_layers=1)
MEM = dict(vocab=11, seq_len=32, dim=128, n_heads=4, n_layers=1)


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_and_sequence_parallel_equal_serial_and_the_formulas(n):
    out = run_ranks(n, "sequence_parallel_vs_serial", json.dumps(CFG), json.dumps(MEM)).stdout
    res = json.loads(out.split("RESULT")[1])
    assert len(res) == n
    for r in res:
        for scheme in ("tp", "tp_sp", "dtensor", "dtensor_sp", "model_sp"):
            assert max(r["cmp"][scheme].values()) < 1e-5, (scheme, r["cmp"][scheme])
        assert r["cmp"]["dtensor"]["vs_hand"] < 1e-5 and r["cmp"]["dtensor_sp"]["vs_hand"] < 1e-5

    cfg = T.TransformerConfig(**MEM)
    m = layout.Model.from_config(cfg)
    for sp in (False, True):
        meas = [next(d for d in r["mem"] if d["sp"] == sp) for r in res]
        pred = layout.activation_bytes_per_layer(m, layout.Layout(tp=n, sp=sp, micro_batch=2))
        assert all(abs(pred - d["saved"]) <= 0.10 * d["saved"] for d in meas), (sp, pred, meas)
        sent = layout.comm_per_step(m, layout.Layout(tp=n, sp=sp, micro_batch=2))["tp"]
        assert all(abs(sent - d["sent"]) <= 0.10 * d["sent"] for d in meas), (sp, sent, meas)
    # sequence parallelism keeps less than tensor parallelism alone, and sends the same bytes
    saved = {d["sp"]: d["saved"] for d in res[0]["mem"]}
    sent = {d["sp"]: d["sent"] for d in res[0]["mem"]}
    assert saved[True] < saved[False] and sent[True] == sent[False]


def test_serial_block_measured_by_the_same_code():
    cfg = T.TransformerConfig(**MEM)
    torch.manual_seed(0)
    block = T.Block(cfg)
    x = torch.randn(2, cfg.seq_len, cfg.dim, requires_grad=True)
    with layout.saved_activations(block) as saved:
        block(x, torch.arange(cfg.seq_len))
    assert sequence_exp.activation_formula(cfg, 2, 1, False) == pytest.approx(saved.bytes, rel=0.10)


def test_sp_formula_shrinks_only_the_norms():
    m = layout.Model.from_config(T.TransformerConfig(**MEM))
    a = layout.activation_bytes_per_layer(m, layout.Layout(tp=4, micro_batch=2))
    b = layout.activation_bytes_per_layer(m, layout.Layout(tp=4, sp=True, micro_batch=2))
    tokens, h = 2 * m.seq_len, m.dim
    # the norms' inputs (2h per token) shrink by tp, and so do their fp32 mean and 1/std
    assert a - b == pytest.approx(4 * tokens * 2 * h * (1 - 1 / 4) + 16 * tokens * (1 - 1 / 4))


def test_bad_splits_are_refused():
    with pytest.raises(ValueError, match="not divisible"):
        sequence._cols(torch.nn.Linear(4, 6), 0, 4)
