"""The exercises of notebook 07 (large batch): steps per epoch, and the LARS and LAMB trust ratios."""
import pytest
import torch

from ddlcourse import optim
from ddlcourse.selfcheck import check, run_checker


def _n(t):
    return float(torch.linalg.vector_norm(t))


def test_steps_per_epoch_keeps_the_last_smaller_batch(capsys):
    assert check("steps_per_epoch", 40, n_train=1_281_167, global_batch=32_768)   # 39.1 -> 40 steps
    assert not check("steps_per_epoch", 39, n_train=1_281_167, global_batch=32_768)
    assert "ceil" in capsys.readouterr().out


def test_trust_ratio_references_on_a_hand_case():
    w, g = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0])          # ||w|| = 5, ||g|| = 1
    assert optim.lars_trust_ratio(w, g, eta=0.1, weight_decay=0.2) == pytest.approx(0.1 * 5 / (1 + 0.2 * 5))
    assert optim.lamb_trust_ratio(w, torch.tensor([0.0, 0.0]), weight_decay=0.2) == pytest.approx(5 / (0.2 * 5))
    assert optim.lars_trust_ratio(torch.zeros(3), g.new_ones(3)) == 1.0


def test_lars_accepts_reference_and_hand_written():
    assert run_checker("lars_trust_ratio", optim.lars_trust_ratio).ok

    def mine(w, g, eta, wd):
        return eta * _n(w) / (_n(g) + wd * _n(w)) if _n(w) > 0 else 1.0
    assert run_checker("lars_trust_ratio", mine).ok


@pytest.mark.parametrize("wrong, hint", [
    (lambda w, g, eta, wd: eta * _n(w) / _n(g), "weight decay term"),
    (lambda w, g, eta, wd: _n(w) / (_n(g) + wd * _n(w)), "trust coefficient eta"),
    (lambda w, g, eta, wd: eta * (_n(g) + wd * _n(w)) / _n(w), "upside down"),
    (lambda w, g, eta, wd: eta * _n(w) / (_n(g) + wd * _n(w)), "never moves"),      # no special case for w = 0
])
def test_lars_names_mistakes(wrong, hint):
    v = run_checker("lars_trust_ratio", wrong)
    assert not v.ok and hint in v.message, v.message


def test_lamb_accepts_reference_and_names_mistakes():
    assert run_checker("lamb_trust_ratio", optim.lamb_trust_ratio).ok
    v = run_checker("lamb_trust_ratio", lambda w, u, wd: _n(w) / _n(u))
    assert not v.ok and "left out the weight decay" in v.message, v.message
    v = run_checker("lamb_trust_ratio", lambda w, u, wd: _n(u + wd * w) / _n(w))
    assert not v.ok and "upside down" in v.message, v.message
