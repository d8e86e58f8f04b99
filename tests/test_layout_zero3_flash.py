"""ZeRO-2/3's data-parallel bytes per step with gradient accumulation, ZeRO-2/3 refused with a pipeline,
FlashAttention and selective recomputation in the activation model, and the hardware figures of step_seconds."""
import dataclasses

import pytest

from ddlcourse import hardware, layout

M70, M7 = layout.PRESETS["70B"], layout.PRESETS["7B"]


def _weight_bytes_per_rank(m, tp, prec=layout.MIXED):
    return prec.param * m.params() / tp            # every layer and the embeddings split by tp, no pipeline


@pytest.mark.parametrize("n_micro", [1, 4, 16])
def test_zero3_gathers_twice_and_reduce_scatters_every_micro_batch(n_micro):
    lay = layout.Layout(dp=64, tp=8, sp=True, zero=3, recompute="full", n_micro=n_micro)
    psi = _weight_bytes_per_rank(M70, 8)
    got = layout.comm_per_step(M70, lay, layout.MIXED)["dp"]
    assert got == pytest.approx(3 * n_micro * 63 / 64 * psi, rel=1e-12)
    # recomputation re-uses the backward's all-gather: no extra bytes
    assert layout.comm_per_step(M70, dataclasses.replace(lay, recompute="none"), layout.MIXED)["dp"] == got


def test_zero3_70b_sends_the_better_part_of_a_terabyte():
    """The issue's case: 70B, dp64, tp8, ZeRO-3 with recomputation, 16 micro-batches: 0.55-0.8 TB, not 51 GB
    (the old formula counted 3 (N-1)/N Psi once per step)."""
    lay = layout.Layout(dp=64, tp=8, sp=True, zero=3, recompute="full", n_micro=16)
    dp = layout.comm_per_step(M70, lay, layout.MIXED)["dp"]
    assert 0.55e12 <= dp <= 0.85e12
    old = 3 * 63 / 64 * _weight_bytes_per_rank(M70, 8)
    assert dp > 10 * old


def test_zero_0_1_send_once_zero2_reduce_scatters_every_micro_batch():
    n = 8
    psi = _weight_bytes_per_rank(M7, 4)
    f = 127 / 128
    for zero, factor in ((0, 2), (1, 2), (2, n + 1), (3, 3 * n)):
        lay = layout.Layout(dp=128, tp=4, sp=True, zero=zero, n_micro=n)
        assert layout.comm_per_step(M7, lay, layout.MIXED)["dp"] == pytest.approx(factor * f * psi, rel=1e-12), zero
    one = layout.Layout(dp=128, tp=4, zero=3, n_micro=1)             # one micro-batch: 1.5x data parallelism
    ddp = layout.Layout(dp=128, tp=4, zero=0, n_micro=1)
    assert (layout.comm_per_step(M7, one, layout.MIXED)["dp"]
            == pytest.approx(1.5 * layout.comm_per_step(M7, ddp, layout.MIXED)["dp"]))


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_3_with_a_pipeline_are_refused(zero):
    with pytest.raises(ValueError, match="pipeline"):
        layout.Layout(dp=16, tp=8, pp=4, zero=zero, n_micro=64)
    layout.Layout(dp=16, tp=8, pp=4, zero=1, n_micro=64)             # ZeRO-1 with a pipeline is fine
    layout.Layout(dp=64, tp=8, pp=1, zero=zero, n_micro=16)          # and ZeRO-2/3 without one


def test_candidates_never_pair_zero_2_3_with_a_pipeline():
    c = layout.candidates(M70, world=64, global_batch=256, memory_limit=80e9)
    assert c and not any(d["layout"].zero >= 2 and d["layout"].pp > 1 for d in c)
    assert any(d["layout"].zero == 3 for d in c)


def test_flash_drops_the_scores_and_keeps_a_log_sum_exp_per_row():
    scores = dataclasses.replace(M7, flash=False)
    assert M7.flash and M70.flash and not layout.Model(n_layers=1, dim=8, n_heads=2, vocab=10, seq_len=16, ffn=32).flash
    lay = layout.Layout(micro_batch=1)
    with_scores = layout.activation_bytes_per_layer(scores, lay, 2)
    flash = layout.activation_bytes_per_layer(M7, lay, 2)
    s, a = M7.seq_len, M7.n_heads
    # the old model: softmax output (bf16) and the bool mask, s*s each
    assert with_scores - flash == pytest.approx(2 * a * s * s + s * s - 4 * a * s)
    assert 1.6e9 < with_scores < 1.65e9 and 0.5e9 < flash < 0.6e9


def test_selective_recompute_drops_the_attention_core_only():
    small = layout.Model(n_layers=4, dim=64, n_heads=4, vocab=100, seq_len=256, ffn=256)
    for tp, sp in ((1, False), (4, True)):
        base = layout.Layout(tp=tp, sp=sp, micro_batch=2)
        full = layout.activation_bytes_per_layer(small, base, 2)
        sel = layout.activation_bytes_per_layer(small, dataclasses.replace(base, recompute="selective"), 2)
        core = 2 * 2 * small.n_heads / tp * small.seq_len ** 2 + small.seq_len ** 2   # softmax (bf16) + mask
        assert full - sel == pytest.approx(core)
    # selective recompute adds no tensor-parallel collective; full recompute repeats the forward ones
    lay = layout.Layout(tp=4, sp=True, micro_batch=2)
    tp0 = layout.comm_per_step(small, lay)["tp"]
    assert layout.comm_per_step(small, dataclasses.replace(lay, recompute="selective"))["tp"] == tp0
    assert layout.comm_per_step(small, dataclasses.replace(lay, recompute="full"))["tp"] == pytest.approx(1.5 * tp0)
    # with FlashAttention selective recompute changes nothing in memory
    l7 = layout.Layout(tp=8, sp=True)
    assert (layout.activation_bytes_per_layer(M7, dataclasses.replace(l7, recompute="selective"))
            == layout.activation_bytes_per_layer(M7, l7))


def test_step_seconds_uses_the_hardware_table():
    lay = layout.Layout(dp=64, tp=8, sp=True, n_micro=16)
    h100 = hardware.GPUS["H100-SXM"]
    a = layout.step_seconds(M7, lay)
    b = layout.step_seconds(M7, lay, flops=h100.bf16_flops, intra_bw=h100.nvlink,
                            inter_bw=hardware.LINKS["NDR IB"].per_direction)
    assert a == b
    comm = layout.comm_per_step(M7, lay, layout.MIXED)
    assert a["intra_node"] == pytest.approx(comm["tp"] / 450e9)
