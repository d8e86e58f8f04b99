"""ddlcourse.amp: loss scaling recovers an fp16 run that underflows, master weights, the dtype DDP sends."""
import pytest
import torch

from ddlcourse import amp
from ddlcourse.selfcheck import run_checker
from ddlcourse.exercises.solutions import mixed_precision as ex

from helpers import run_ranks


def test_update_scale_is_torchs_rule():
    flags = [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0]
    scale, tracker = torch.tensor([2.0 ** 16]), torch.tensor([0], dtype=torch.int32)
    theirs = []
    for f in flags:
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(f)]), 2.0, 0.5, 3)
        theirs.append(float(scale))
    assert amp.scale_trajectory(flags, growth_interval=3) == theirs


def test_plain_fp16_loses_the_run_and_the_scaler_recovers_it():
    runs = amp.compare_modes(steps=12)
    assert runs["fp16"]["zero_grad_fraction"][0] == 1.0          # every gradient of the last layer underflows
    assert runs["fp16"]["losses"][-1] == runs["fp16"]["losses"][0]
    assert runs["fp16+scaler"]["zero_grad_fraction"][0] == 0.0
    assert amp.recovered(runs)["both"]


def test_recovered_says_no_when_fp16_does_not_lose():
    runs = amp.compare_modes(steps=12, target_scale=1.0)      # ordinary gradients: nothing underflows
    assert not amp.recovered(runs)["fp16_lost"]


def test_bad_mode_is_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        amp.train("fp8")


def test_small_updates_need_master_weights():
    assert amp.lost_update(1.0, 1e-4) and not amp.lost_update(1.0, 1e-3)
    assert amp.spacing(1.0) == 2.0 ** -10
    assert amp.accumulate(1.0, -1e-4, 100, master=False)[-1] == 1.0
    assert amp.accumulate(1.0, -1e-4, 100, master=True)[-1] == pytest.approx(0.99, abs=1e-3)


def test_master_weights_optimizer_follows_fp32():
    ref = amp.train_fp32_reference(steps=15, lr=0.05)
    got = amp.train_half_model(master=True, steps=15, lr=0.05)
    assert got[-1] < 0.5 * got[0]
    assert abs(got[-1] - ref[-1]) < 0.02 * ref[-1]


def test_master_weights_optimizer_skips_overflowing_steps():
    model = torch.nn.Linear(4, 1).half()
    opt = amp.MasterWeightsOptimizer(model, torch.optim.SGD, lr=0.1, init_scale=2.0 ** 16)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    opt.backward(model(torch.full((2, 4), 100.0).half()).sum() * 1e3)   # x 65536: overflows fp16
    assert opt.step() is False and opt.skipped == 1 and opt.scale == 2.0 ** 15
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bytes_per_param():
    assert sum(amp.bytes_per_param("fp16-master").values()) == 16
    with pytest.raises(ValueError):
        amp.bytes_per_param("fp8")


def test_dp_mixed_precision_on_two_ranks():
    out = run_ranks(2, "amp_dp_mixed_precision").stdout
    assert "SENT [['float32'], ['float16'], ['float16']]" in out
    zeros = eval(out.split("ZERO ")[1].splitlines()[0])
    assert zeros[0] == 0.0 and zeros[1] > 0.5 and zeros[2] == 0.0
    assert "DTYPE {'float32'}" in out


def test_dp_mixed_precision_on_a_subgroup():
    """The compress hook reduces over DDP's group: two ranks of three train, the third does not take part (a
    hook that all-reduced over the world would wait for it for ever)."""
    out = run_ranks(3, "amp_dp_mixed_precision_subgroup", timeout=120).stdout
    assert "SENT [['float32'], ['float16'], ['float16']]" in out, out


# --------------------------------------------------------------------------- the coding exercise
def test_loss_scale_checker_accepts_the_reference():
    assert run_checker("loss_scale_update", amp.update_scale).ok


@pytest.mark.parametrize("wrong, hint", [
    (ex._grow_every_step, "growth_interval clean steps in a row"),
    (ex._no_reset_on_inf, "after an overflow, restart the count"),
    (ex._no_reset_after_growth, "after growing the scale"),
    (ex._grow_on_inf, "the factors are swapped"),
    (ex._off_by_one, "one step late"),
])
def test_loss_scale_checker_names_the_mistake(wrong, hint):
    v = run_checker("loss_scale_update", wrong)
    assert not v.ok and hint in v.message


def test_loss_scale_checker_before_an_answer():
    def skeleton(*a, **k):
        raise NotImplementedError
    assert "not written yet" in run_checker("loss_scale_update", skeleton).message
