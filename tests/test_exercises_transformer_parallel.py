"""Checkers of the coding exercises of the context- and expert-parallel notebooks: accept the reference,
name the typical mistakes."""
from ddlcourse import selfcheck
from ddlcourse.exercises.solutions import context_parallel as cpx
from ddlcourse.exercises.solutions import expert_parallel as epx
from ddlcourse.models.transformer import route
from ddlcourse.parallel.context import online_softmax_update


def test_online_softmax_checker():
    assert selfcheck.run_checker("online_softmax_update", online_softmax_update).ok
    v = selfcheck.run_checker("online_softmax_update", cpx._no_rescale_o)
    assert not v.ok and "running output" in v.message
    v = selfcheck.run_checker("online_softmax_update", cpx._no_rescale_l)
    assert not v.ok and "running sum" in v.message
    v = selfcheck.run_checker("online_softmax_update", cpx._no_max)
    assert not v.ok and "running max" in v.message


def test_moe_route_checker():
    assert selfcheck.run_checker("moe_route", lambda l, k, c: route(l, k, c)[:3]).ok
    assert "capacity" in selfcheck.run_checker("moe_route", epx._no_capacity).message
    assert "renormalised" in selfcheck.run_checker("moe_route", epx._no_renormalise).message
    assert "priority" in selfcheck.run_checker("moe_route", epx._token_major).message

    def unwritten(*a):
        raise NotImplementedError
    assert "not written yet" in selfcheck.run_checker("moe_route", unwritten).message
