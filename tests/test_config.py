import pytest

from ddlcourse import config


def test_every_section_defines_every_scale_with_same_keys():
    config.check_profiles()


def test_scale_from_environment(monkeypatch):
    monkeypatch.setenv("DDLCOURSE_SCALE", "laptop")
    assert config.get_scale() == "laptop"
    monkeypatch.setenv("DDLCOURSE_SCALE", " Smoke ")
    assert config.get_scale() == "smoke"
    monkeypatch.delenv("DDLCOURSE_SCALE")
    assert config.get_scale() == "laptop"


def test_explicit_scale_wins(monkeypatch):
    monkeypatch.setenv("DDLCOURSE_SCALE", "cluster")
    assert config.sizes("setup_check", scale="smoke").scale == "smoke"


@pytest.mark.parametrize("bad", ["huge", "", "SMOKEY"])
def test_unknown_scale_is_a_clear_error(monkeypatch, bad):
    monkeypatch.setenv("DDLCOURSE_SCALE", bad)
    with pytest.raises(config.ScaleError, match="choose one of smoke, laptop, cluster"):
        config.get_scale()


def test_unknown_section_and_override():
    with pytest.raises(config.ScaleError, match="no scale section"):
        config.sizes("nope")
    with pytest.raises(config.ScaleError, match="has no size"):
        config.sizes("setup_check", scale="smoke", bogus=1)
    assert config.sizes("setup_check", scale="smoke", n_ranks=3).n_ranks == 3


def test_selfcheck_right_wrong_and_unanswered(capsys):
    from ddlcourse.selfcheck import check
    assert check("allreduce_sum", 10, n_ranks=4)
    assert not check("allreduce_sum", 8, n_ranks=4)
    assert not check("allreduce_mean", None, n_ranks=4)
    out = capsys.readouterr().out
    assert "correct" in out and "Hint" in out and "not answered" in out
    with pytest.raises(KeyError, match="no exercise"):
        check("nope", 1)
