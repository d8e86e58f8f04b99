"""Notebook 14's coding exercises, beyond tests/test_build_it.py (which runs every registered solution and mistake):
the checkpointing checker accepts the other correct route and explains the reentrant trap."""
import torch
import torch.utils.checkpoint

from ddlcourse.selfcheck import run_checker


def _reentrant(requires_grad: bool):
    def forward(layers, x, segments):
        n = len(layers)
        bounds = [k * n // segments for k in range(segments + 1)]
        h = x.detach().requires_grad_(True) if requires_grad else x
        for a, b in zip(bounds[:-1], bounds[1:]):
            h = torch.utils.checkpoint.checkpoint(layers[a:b], h, use_reentrant=True)
        return h
    return forward


def test_checkpointed_forward_accepts_reentrant_checkpointing():
    assert run_checker("checkpointed_forward", _reentrant(True)).ok


def test_checkpointed_forward_explains_reentrant_without_an_input_that_requires_grad():
    v = run_checker("checkpointed_forward", _reentrant(False))
    assert not v.ok and "use_reentrant=True the input must require grad" in v.message, v.message
