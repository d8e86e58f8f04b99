"""The sizing notebook's pieces: ZeRO model-state bytes, the rough step time, and the zero_memory checker."""
import pytest

from ddlcourse import layout, selfcheck
from ddlcourse.exercises.checkers import sizing_a_layout as ex
from ddlcourse.exercises.solutions import sizing_a_layout as sol


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_state_bytes_is_the_dense_part_of_memory_per_rank(zero):
    m = layout.Model(n_layers=4, dim=64, n_heads=4, vocab=100, seq_len=32, ffn=256)
    lay = layout.Layout(dp=8, zero=zero)
    mem = layout.memory_per_rank(m, lay, layout.MIXED)
    st = layout.model_state_bytes(m.params(), 8, zero, layout.MIXED)
    for k in ("params", "grads", "optimizer"):
        assert mem[k] == pytest.approx(st[k])
    assert sum(layout.model_state_bytes(m.params(), 1, 0, layout.MIXED).values()) == 16 * m.params()


def test_model_state_bytes_refuses_bad_input():
    with pytest.raises(ValueError, match="zero"):
        layout.model_state_bytes(10, 2, 4)
    with pytest.raises(ValueError, match="replicas"):
        layout.model_state_bytes(10, 0, 1)


def test_step_seconds_parts():
    m = layout.PRESETS["7B"]
    a = layout.step_seconds(m, layout.Layout(dp=64, tp=8, sp=True, n_micro=16))
    b = layout.step_seconds(m, layout.Layout(dp=64, tp=8, sp=True, n_micro=16, recompute="full"))
    assert b["compute"] == pytest.approx(a["compute"] * 8 / 6)
    assert a["bubble"] == 0 and a["total"] == pytest.approx(sum(v for k, v in a.items() if k != "total"))
    p = layout.step_seconds(m, layout.Layout(dp=16, tp=8, pp=4, sp=True, n_micro=64))
    assert p["bubble"] == pytest.approx(p["compute"] * 3 / 64)


def test_zero_memory_checker():
    assert selfcheck.run_checker("zero_memory", ex._ref).ok

    def correct(n, replicas, zero):           # written here, not the package's
        shard = lambda stage: n / replicas if zero >= stage else n   # noqa: E731
        return dict(params=2 * shard(3), grads=2 * shard(2), optimizer=12 * shard(1))
    assert selfcheck.run_checker("zero_memory", correct).ok
    assert "one thing too many" in selfcheck.run_checker("zero_memory", sol._off_by_one).message
    assert "master weights" in selfcheck.run_checker("zero_memory", sol._no_master).message
    assert "stage 1 the optimizer state only" in selfcheck.run_checker("zero_memory", sol._all_at_once).message

    def unwritten(*a):
        raise NotImplementedError
    assert "not written yet" in selfcheck.run_checker("zero_memory", unwritten).message
