"""The exercises of notebook 12 (large batch): steps per epoch, the LARS and LAMB trust ratios and the LAMB step.
tests/test_build_it.py runs every checker on the registered solution, each typical mistake and the template."""
import math

import pytest
import torch

from ddlcourse import optim
from ddlcourse.exercises.solutions import large_batch as sol
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


def test_trust_ratio_checkers_accept_the_package_functions():
    assert run_checker("lars_trust_ratio", optim.lars_trust_ratio).ok
    assert run_checker("lamb_trust_ratio", optim.lamb_trust_ratio).ok


def test_lamb_step_reference_on_a_hand_case():
    """Step 1: the bias-corrected moments are g and g**2, so Adam's step is g / (|g| + eps), about sign(g)."""
    w = torch.tensor([3.0, 4.0], dtype=torch.float64)
    g = torch.tensor([1.0, -2.0], dtype=torch.float64)
    for step in (sol.my_lamb_step, sol._lamb_variant()):
        p = [w.clone()]
        step(p, [g], {}, lr=0.1, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0)
        ratio = 5 / math.sqrt(2)                          # ||w|| / ||(1, -1)||
        assert torch.allclose(p[0], w - 0.1 * ratio * torch.tensor([1.0, -1.0], dtype=torch.float64))


def test_lamb_step_checker_names_a_nan():
    def from_t0(params, grads, state, lr, betas, eps, weight_decay):
        state.setdefault("t", 0)
        for p, g in zip(params, grads):        # bias correction with t = 0: division by zero
            p.sub_(lr * g / (1 - betas[0] ** state["t"]))
    v = run_checker("lamb_step", from_t0)
    assert not v.ok and "NaN" in v.message, v.message


def test_lab3_trains_with_a_lamb_step_written_as_a_function():
    """cases.topology.FunctionOptimizer runs the learner's LAMB step as a torch optimizer: the same parameters
    as calling the function by hand, and its state survives a state_dict round trip (a checkpoint)."""
    from ddlcourse.cases.topology import FunctionOptimizer, _optimizer

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double()
    by_hand = [p.detach().clone() for p in model.parameters()]
    opt = _optimizer("lamb", model.parameters(), 0.01, step_fn=sol.my_lamb_step)
    assert isinstance(opt, FunctionOptimizer)
    state = {}
    x = torch.randn(8, 4, dtype=torch.float64)
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        sol.my_lamb_step(by_hand, grads, state, 0.01, (0.9, 0.999), 1e-6, 0.0)
        for p, q in zip(model.parameters(), by_hand):   # the same parameters after every step
            assert torch.allclose(p, q, rtol=0, atol=1e-12)
    again = _optimizer("lamb", model.parameters(), 0.01, step_fn=sol.my_lamb_step)
    again.load_state_dict(opt.state_dict())
    assert again.fn_state[0]["step"] == 3
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        _optimizer("adam", model.parameters(), 0.01, step_fn=sol.my_lamb_step)
