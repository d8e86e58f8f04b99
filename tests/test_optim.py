"""The optimizer factory: every name builds, warmup ramps the lr, and each optimizer learns a toy task."""
import pytest
import torch

from ddlcourse.optim import OPTIMIZERS, make_optimizer, make_optimizer_and_schedule

LRS = {"sgd": 0.1, "adam": 0.1, "lars": 0.5, "lamb": 0.3, "shampoo": 1.0, "soap": 0.1}
KW = {"lars": dict(trust_coefficient=0.1)}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_optimizer_lowers_the_loss(name):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    X = torch.randn(64, 4)
    y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    opt, sched = make_optimizer_and_schedule(name, model.parameters(), lr=LRS[name], warmup_steps=3,
                                             **KW.get(name, {}))
    first = None
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(model(X), y)
        first = first if first is not None else loss.item()
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    assert loss.item() < 0.5 * first, (name, first, loss.item())


def test_warmup_ramps_lr():
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt, sched = make_optimizer_and_schedule("sgd", p, lr=0.8, warmup_steps=4)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step(); sched.step()
    assert seen == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8])


def test_case_insensitive_and_kwargs():
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt = make_optimizer("SGD", p, lr=0.1, momentum=0.5, nesterov=True)
    assert opt.param_groups[0]["momentum"] == 0.5 and opt.param_groups[0]["nesterov"]
    assert type(make_optimizer("lamb", p, lr=0.1)).__name__ == "Lamb"


def test_bad_name_and_lr():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("kfac2", p, lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        make_optimizer("sgd", p, lr=0)


def test_soap_state_is_plain_tensors_so_checkpoints_load_with_weights_only(tmp_path):
    """SOAP keeps lists of matrices; state_tensors finds them, and a checkpoint loads with weights_only=True."""
    from ddlcourse.optim import state_tensors
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 4, 3)
    opt = make_optimizer("soap", model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad(); model(torch.randn(2, 3, 8, 8)).square().mean().backward(); opt.step()
    shapes = sorted(tuple(t.shape) for t in state_tensors(opt))
    assert (4, 4) in shapes and (3, 3) in shapes          # the per-dimension preconditioner matrices
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    fresh = make_optimizer("soap", model.parameters(), lr=0.01)
    fresh.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    assert sum(t.numel() for t in state_tensors(fresh)) == sum(t.numel() for t in state_tensors(opt))
