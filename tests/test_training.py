import pytest
import torch

from ddlcourse import training


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def test_checkpoint_roundtrip_keeps_last_two_and_loads_weights_only(tmp_path):
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.ones(1, 3)).sum().backward(); opt.step()
    ck = training.Checkpointer(tmp_path)
    for e in (1, 2, 3):
        ck.save(e, m, opt, history=[1.0, 0.5], note="x")
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["epoch-0002.pt", "epoch-0003.pt"]
    torch.load(tmp_path / "epoch-0003.pt", weights_only=True)      # no pickled objects inside
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    epoch, extra = training.Checkpointer(tmp_path).load(m2, opt2)
    assert epoch == 3 and extra == {"history": [1.0, 0.5], "note": "x"}
    assert torch.equal(m2.weight, m.weight)
    assert opt2.state_dict()["state"][0]["momentum_buffer"].equal(opt.state_dict()["state"][0]["momentum_buffer"])


def test_no_checkpoint_starts_at_zero(tmp_path):
    assert training.Checkpointer(tmp_path / "new").load(_model()) == (0, {})


def test_corrupt_newest_falls_back_then_clear_error(tmp_path):
    m = _model()
    ck = training.Checkpointer(tmp_path)
    ck.save(1, m)
    ck.save(2, m)
    (tmp_path / "epoch-0002.pt").write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="unreadable"):
        assert ck.load(_model())[0] == 1
    (tmp_path / "epoch-0001.pt").write_bytes(b"also bad")
    with pytest.warns(UserWarning), pytest.raises(training.CheckpointError, match="no readable checkpoint"):
        ck.load(_model())


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    training.Checkpointer(tmp_path).save(1, torch.nn.Linear(3, 2))
    with pytest.warns(UserWarning), pytest.raises(training.CheckpointError, match="model settings"):
        training.Checkpointer(tmp_path).load(torch.nn.Linear(4, 2))


def test_progress_file(tmp_path):
    import json
    f = str(tmp_path / "p.json")
    p = training.Progress(3, "x", enabled=True, progress_file=f)
    for _ in range(3):
        p.update(loss=0.5)
    assert json.load(open(f)) == {"n": 3, "total": 3, "desc": "x", "postfix": {"loss": 0.5}}


def test_setup_takes_a_config_only():
    """One way in: the case's config (the backend string it once took as well is refused, and says so)."""
    with pytest.raises(TypeError, match="takes the case's config"):
        training.setup("gloo")


def test_run_dir_is_a_new_folder_on_the_shared_results_path(monkeypatch, tmp_path):
    """Checkpoints that ranks on other nodes read go under results/, never a node-local temporary folder."""
    from ddlcourse import training
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    a, b = training.run_dir("dcp"), training.run_dir("dcp")
    assert a != b and a.parent == b.parent == tmp_path / "dcp" and not any(a.iterdir())
