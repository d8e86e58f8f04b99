"""ddlcourse.perfmodel: known answers of the alpha-beta collectives, the step model, the fit, the
calibration (reproduces its point by construction, and is never counted as a check), and the held-out
published points (each within 15%)."""
import json
import math
from dataclasses import replace

import pytest

from ddlcourse import perfmodel as pm

from helpers import run_ranks

LINK = pm.Link(alpha=5e-6, bandwidth=10e9)


def test_ring_known_answer():
    # p = 4, 1 MB: 2*3*5 us + 2*(3/4)*1e6 B / 1e10 B/s = 30 us + 150 us
    assert pm.ring_allreduce_time(1e6, 4, LINK) == pytest.approx(180e-6)
    assert pm.ring_allreduce_time(1e6, 1, LINK) == 0.0


def test_tree_known_answer_and_crossover():
    # p = 1024: 2*10*5 us + 2*n*beta
    assert pm.tree_allreduce_time(1e3, 1024, LINK) == pytest.approx(100e-6 + 2e3 / 10e9)
    # small message, many ranks: the tree's log latency wins; big message, few ranks: the ring wins
    assert pm.allreduce_time(1e3, 1024, LINK, "tree") < pm.allreduce_time(1e3, 1024, LINK, "ring")
    assert pm.allreduce_time(1e9, 4, LINK, "ring") < pm.allreduce_time(1e9, 4, LINK, "tree")
    assert pm.allreduce_time(1e9, 4, LINK) == pm.allreduce_time(1e9, 4, LINK, "ring")


def test_bad_input():
    with pytest.raises(ValueError, match="ring"):
        pm.allreduce_time(1e6, 4, LINK, "butterfly")
    with pytest.raises(ValueError, match="multiple of num_stages"):
        pm.step(pm.RESNET50, pm.SYSTEMS["summit"], 6, num_stages=4)
    with pytest.raises(ValueError):
        pm.fit_alpha_beta([1.0], [1.0])


def test_fit_recovers_alpha_beta():
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    times = [pm.ring_allreduce_time(n, 2, LINK) for n in sizes]
    fit = pm.fit_alpha_beta(sizes, times, p=2)
    assert fit.alpha == pytest.approx(LINK.alpha, rel=1e-6)
    assert fit.bandwidth == pytest.approx(LINK.bandwidth, rel=1e-6)


def test_buckets_and_overlap():
    assert pm.bucket_sizes(102e6, 25e6) == pytest.approx([25e6] * 4 + [2e6])
    ar = lambda n: n / 1e9  # noqa: E731  1 GB/s, no latency
    # no overlap: compute, then every bucket one after another
    assert pm.comm_schedule(1.0, 2.0, [1e9, 1e9], ar, overlap=False) == pytest.approx(5.0)
    # overlap: bucket 0 ready at 2.0 -> done 3.0; bucket 1 ready at 3.0 -> done 4.0
    assert pm.comm_schedule(1.0, 2.0, [1e9, 1e9], ar, overlap=True) == pytest.approx(4.0)


def test_perfect_network_and_no_jitter_scale_linearly():
    fast = pm.System("ideal", 8, 1e12, pm.Link(0.0, 1e30), pm.Link(0.0, 1e30))
    rows = pm.predict(pm.RESNET50, fast, [1, 2, 64, 4096], jitter_cv=0.0)
    assert all(r.efficiency == pytest.approx(1.0) for r in rows)


def test_slower_network_fp16_and_stragglers_move_the_right_way():
    base = pm.what_if()
    assert pm.what_if(inter=pm.Link(5e-6, 1.25e9))["efficiency"] < base["efficiency"]
    assert pm.what_if(bytes_per_grad=2)["comm_time"] == pytest.approx(base["comm_time"] / 2, rel=0.2)
    assert pm.what_if(jitter_cv=0.0)["efficiency"] > base["efficiency"]
    assert pm.expected_max_normal(1) == 0.0
    assert pm.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)  # exact: 0.564


def test_calibration_reproduces_its_point_and_is_not_counted():
    rows = {r["key"]: r for r in pm.validate()}
    for pt in pm.PUBLISHED:
        r = rows[pt.key]
        if pt.role == "calibration":
            # by construction: the fitted mfu makes the model return the published value
            assert r["predicted"] == pytest.approx(pt.value, rel=1e-6)
            assert not r["counted"] and r["within"] is None
        else:
            assert r["counted"] and pt.calibrated_by in pm.POINTS
            assert pm.POINTS[pt.calibrated_by].role == "calibration"
    # the calibrated mfu is a plausible fraction of peak, and it is the one held-out points use
    mfu = pm.calibrate_mfu(pm.POINTS["goyal2017_throughput"])
    assert 0.05 < mfu < 1.0
    assert pm.configured(pm.POINTS["yin2019_summit"])[0].mfu == pytest.approx(mfu)
    with pytest.raises(ValueError, match="throughput"):
        pm.calibrate_mfu(pm.POINTS["yin2019_summit"])


def test_every_held_out_point_within_15_percent():
    rows = pm.validate()
    held = [r for r in rows if r["counted"]]
    assert len(held) >= 2                    # calibration rows are never part of this check
    print("\n" + pm.format_validation(rows))
    assert all(r["within"] for r in held), pm.format_validation(rows)


def test_every_point_has_a_precise_source():
    for pt in pm.PUBLISHED:
        assert pt.role in ("calibration", "held-out")
        assert any(str(y) in pt.source for y in range(2010, 2030)), pt.source   # a year
        assert "abstract" in pt.source or "Table" in pt.source or "Fig" in pt.source, pt.source  # where


def test_sensitivity_moves_each_constant_and_a_wider_band_swings_more():
    pt = pm.POINTS["yin2019_summit"]
    rows = pm.sensitivity(pt, rel=0.2)
    assert {r["constant"] for r in rows} == set(pm.CONSTANTS)
    base = pm.validate([pt])[0]["predicted"]
    assert all(r["base"] == pytest.approx(base) for r in rows)
    jit = next(r for r in rows if "jitter" in r["constant"])
    assert jit["low"] > base > jit["high"]            # less jitter, higher efficiency
    wide = {r["constant"]: r["swing"] for r in pm.sensitivity(pt, rel=0.5)}
    assert wide[jit["constant"]] > jit["swing"]
    # a slow network makes the bandwidth matter: the prediction then swings by more than 10%
    pm.SYSTEMS["_slow"] = replace(pm.SYSTEMS["summit"], inter=pm.Link(20e-6, 0.125e9))
    try:
        rows = pm.sensitivity(replace(pt, system="_slow"))
        bw = next(r for r in rows if r["constant"] == "network bandwidth (inter)")
        assert bw["swing"] > 0.1 and bw["high"] > bw["low"]
    finally:
        del pm.SYSTEMS["_slow"]


def test_tensor_core_what_if_shortens_compute_and_network_units():
    fp32 = pm.what_if()
    tc = pm.what_if(peak_flops=pm.V100_TENSOR_FP16)
    assert tc["compute_time"] == pytest.approx(fp32["compute_time"] * pm.V100_FP32 / pm.V100_TENSOR_FP16)
    assert tc["throughput"] > fp32["throughput"]
    # 1 GbE moves 0.125 GB/s, 10 GbE 1.25 GB/s: ten times the bandwidth, far less exposed communication
    gbe1 = pm.what_if(inter=pm.Link(20e-6, 0.125e9))
    gbe10 = pm.what_if(inter=pm.Link(20e-6, 1.25e9))
    assert gbe1["exposed_comm"] > 5 * gbe10["exposed_comm"]


def test_measure_allreduce_on_two_ranks_and_fit():
    out = run_ranks(2, "perfmodel_measure_allreduce").stdout
    t = {int(k): v for k, v in json.loads(out.split("RESULT", 1)[1]).items()}
    assert sorted(t) == [4096, 262144, 1048576] and all(v > 0 for v in t.values())
    link = pm.fit_alpha_beta(list(t), list(t.values()), p=2)
    assert link.alpha > 0 and link.bandwidth > 0


def test_measure_compute():
    c = pm.measure_compute(micro_batch=4, image=16, repeats=1)
    assert c["t_sample"] > 0 and c["n_params"] > 0


# ----------------------------------------------------------------------------------------- any model (the labs)
def test_flops_of_a_linear_layer_and_its_parameters():
    import torch
    lin = torch.nn.Linear(30, 20)
    fwd, n = pm.count_flops(lin, torch.zeros(5, 30))
    assert fwd == 2 * 30 * 20                       # per sample: one multiply-add per weight
    assert n == 30 * 20 + 20                        # weights and bias
    wl = pm.workload_from_model("linear", lin, (5, 30), micro_batch=8, mfu=0.5, bytes_per_grad=2)
    assert wl.flops_per_sample == 3 * 2 * 30 * 20 and wl.n_params == n
    assert wl.grad_bytes == 2 * n and wl.micro_batch == 8 and wl.mfu == 0.5
    # frozen parameters are not allreduced; the model itself is left on its device, untouched
    lin.bias.requires_grad_(False)
    assert pm.count_flops(lin, (1, 30))[1] == 30 * 20
    assert lin.weight.device.type == "cpu"


def test_flops_of_a_convolution_known_answer():
    import torch
    conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1)
    fwd, _ = pm.count_flops(conv, (2, 3, 16, 16))
    assert fwd == 2 * (3 * 3 * 3) * 8 * 16 * 16     # 2 x (k*k*c_in) x c_out x output pixels


def test_workload_from_model_bad_input():
    import torch
    lin = torch.nn.Linear(4, 3)
    with pytest.raises(TypeError, match="nn.Module"):
        pm.count_flops(lambda x: x, (1, 4))
    with pytest.raises(TypeError, match="input shape"):
        pm.count_flops(lin, "1x4")
    with pytest.raises(ValueError, match="batch dimension"):
        pm.count_flops(lin, (0, 4))
    with pytest.raises(ValueError, match="shape"):
        pm.count_flops(lin, (1, 5))                 # wrong feature size: says which shape failed
    with pytest.raises(ValueError, match="no trainable parameters"):
        pm.count_flops(torch.nn.ReLU(), (1, 4))
    with pytest.raises(ValueError, match="no FLOPs"):
        pm.count_flops(torch.nn.LayerNorm(4), (1, 4))
    with pytest.raises(ValueError, match="mfu"):
        pm.workload_from_model("x", lin, (1, 4), micro_batch=1, mfu=1.5)
    with pytest.raises(ValueError, match="micro_batch"):
        pm.workload_from_model("x", lin, (1, 4), micro_batch=0, mfu=0.5)
    with pytest.raises(ValueError, match="bytes_per_grad"):
        pm.workload_from_model("x", lin, (1, 4), micro_batch=1, mfu=0.5, bytes_per_grad=3)
    wl = pm.workload_from_model("x", lin, (1, 4), micro_batch=1, mfu=0.5)
    with pytest.raises(ValueError, match="unknown system"):
        pm.predict_lab(wl, "fugaku")
    with pytest.raises(ValueError, match="positive"):
        pm.predict_lab(wl, "summit", world_sizes=[0, 2])


def test_predict_lab_weak_scaling_compute_against_allreduce():
    """A compute-heavy model scales better than one whose gradients are large for its FLOPs, and a gradient
    smaller than one bucket cannot be overlapped (it is ready only at the end of the backward pass)."""
    heavy = pm.Workload("heavy", flops_per_sample=1e12, n_params=1e6, micro_batch=32, mfu=0.3)
    light = pm.Workload("light", flops_per_sample=1e8, n_params=100e6, micro_batch=32, mfu=0.3)
    ph, pl = pm.predict_lab(heavy), pm.predict_lab(light)
    assert [r.world_size for r in ph[True]] == list(pm.WEAK_SIZES)
    assert ph[True][0].efficiency == pytest.approx(1.0)
    assert pm.dominant_part(ph[True][-1]) == "compute"
    assert pm.dominant_part(pl[True][-1]) == "gradient allreduce"
    assert pl[True][-1].efficiency < ph[True][-1].efficiency
    assert pl[True][-1].efficiency > pl[False][-1].efficiency          # 400 MB in 16 buckets: overlap helps
    assert ph[True][-1].step_time == pytest.approx(ph[False][-1].step_time)   # 4 MB, one bucket: it cannot
    text = pm.format_lab_prediction(heavy, ph, "Summit")
    assert "PREDICTED on 256 GPUs of Summit" in text and "compute dominates" in text
