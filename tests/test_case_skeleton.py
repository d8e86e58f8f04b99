"""The case skeleton (ddlcourse.training): validated configs and overrides, resume and its message, corrupt
checkpoints, results written once, batches moved to the device, synchronised timers, groups built once, CLI."""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pytest
import torch

from ddlcourse import cases, training
from ddlcourse.training import ConfigError

from helpers import run_ranks


@dataclass(kw_only=True)
class Demo(training.CaseConfig):
    CASE: ClassVar[str] = "demo"
    SECTION: ClassVar[str] = "topology"          # a real scale section: its epochs, lr, global_batch, n_train
    n_train: int = training.setting(min=1, help="training samples")
    epochs: int = training.setting(min=1, help="passes over the data")
    lr: float = training.setting(above=0, help="the learning rate")
    global_batch: int = training.setting(min=1, help="samples per step")
    syncbn: bool = True
    init_from: str | None = None
    sizes: list[int] | None = training.setting(None, min=1, help="sizes")
    mode: str = training.setting("a", choices=("a", "b"), help="a mode")


def demo(scale="smoke", **kw) -> Demo:
    return Demo.make(scale, **kw)


# --------------------------------------------------------------------------- configs and overrides
def test_config_takes_the_scale_sizes_and_the_run_options():
    from ddlcourse import config
    cfg = demo()
    s = config.sizes("topology", "smoke")
    assert (cfg.n_train, cfg.epochs, cfg.lr, cfg.global_batch) == (s.n_train, s.epochs, s.lr, s.global_batch)
    assert (cfg.scale, cfg.backend, cfg.ranks, cfg.seed, cfg.run_name, cfg.fresh) == \
        ("smoke", "ddp", None, 0, "default", False)


@pytest.mark.parametrize("over, message", [
    (dict(epoch=3), "unknown demo setting(s) epoch; known settings: backend, epochs, fresh, global_batch"),
    (dict(epochs="abc"), "epochs=abc: expected a whole number"),
    (dict(epochs=2.5), "epochs=2.5: expected a whole number"),
    (dict(epochs=-3), "epochs=-3: must be >= 1"),
    (dict(lr=0), "lr=0.0: must be > 0"),
    (dict(sizes=[2, 0]), "sizes=[2, 0]: must be >= 1"),
    (dict(mode="c"), "unknown mode 'c'; choose one of a, b"),
    (dict(lr="fast"), "lr=fast: expected a number"),
    (dict(global_batch=0), "global_batch=0: must be >= 1"),
    (dict(syncbn="maybe"), "syncbn=maybe: expected true or false"),
    (dict(backend="mpi"), f"unknown backend 'mpi'; choose one of {', '.join(training.BACKENDS)}"),
    (dict(ranks=0), "ranks=0: must be >= 1"),
    (dict(run_name="../x"), "run_name='../x': must be a plain folder name"),
])
def test_bad_overrides_are_refused_with_clear_messages(over, message):
    with pytest.raises(ConfigError) as e:
        demo(**over)
    assert message in str(e.value)


def test_unknown_scale_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown scale 'huge'"):
        demo("huge")


def test_command_line_overrides_are_typed_once_by_the_config():
    over = training.parse_overrides(Demo, ["epochs=3", "lr=1e-3", "syncbn=false", "init_from=none",
                                           "sizes=1,2,3", "run_name=r1", "fresh=yes", "ranks=2"])
    assert over == {"epochs": "3", "lr": "1e-3", "syncbn": "false", "init_from": "none", "sizes": "1,2,3",
                    "run_name": "r1", "fresh": "yes", "ranks": "2"}     # split and named here, converted once below
    cfg = demo(**over)
    assert (cfg.epochs, cfg.lr, cfg.syncbn, cfg.init_from, cfg.sizes, cfg.fresh, cfg.ranks) == \
        (3, 1e-3, False, None, [1, 2, 3], True, 2)
    assert type(cfg.epochs) is int and type(cfg.lr) is float
    assert demo(init_from="other").init_from == "other"
    for bad, message in (("epochs", "expected key=value"), ("batch=3", "unknown demo setting(s) batch;"),
                         ("epochs=-3", "epochs=-3: must be >= 1")):
        with pytest.raises(ConfigError) as e:
            demo(**training.parse_overrides(Demo, [bad]))
        assert message in str(e.value)


def test_replace_validates_too():
    with pytest.raises(ConfigError, match="epochs=-3"):
        replace(demo(), epochs=-3)


def test_case_configs_refuse_bad_values():
    from ddlcourse.cases import maize, topology
    with pytest.raises(ConfigError, match="seg_epochs=-3: must be >= 1"):
        maize.Config.make("smoke", seg_epochs=-3)
    with pytest.raises(ConfigError, match="ae_lr=0.0"):
        maize.Config.make("smoke", ae_lr=0)
    with pytest.raises(ConfigError, match="epochs=-3: must be >= 0"):
        topology.Config.make("smoke", epochs=-3)
    with pytest.raises(ConfigError, match="unknown topology setting"):
        topology.Config.make("smoke", resume=False)


# --------------------------------------------------------------------------- a tiny case on the skeleton
def _fit(cfg: Demo, stop_after: int | None = None) -> dict:
    """A case in miniature: linear regression, one checkpoint per epoch; ``stop_after`` simulates a crash."""
    ctx = training.setup(cfg)
    torch.manual_seed(0)
    model = ctx.to(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    ckpt = ctx.checkpointer("demo", epochs=cfg.epochs)
    start, extra = ckpt.load(model, opt)
    losses = list(extra.get("losses", []))
    model, opt = ctx.wrap(model, opt)
    g = torch.Generator().manual_seed(1)
    X, w = torch.randn(cfg.n_train, 3, generator=g), torch.tensor([[1.0], [-2.0], [0.5]])
    for epoch in range(start, cfg.epochs):
        if stop_after is not None and epoch == stop_after:
            raise KeyboardInterrupt
        for idx in ctx.batches(cfg.n_train, cfg.global_batch, epoch, drop_last=True):
            x, y = ctx.to((X[idx], X[idx] @ w))
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(ctx.mean(loss.item()))
        ckpt.save(epoch + 1, model, opt, losses=losses)
    return dict(start=start, losses=losses, weight=model.weight.detach().clone())


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    return tmp_path


def test_resume_message_and_epoch_after_an_interrupted_run(results, capsys):
    full = _fit(demo(run_name="full", epochs=4, lr=0.05))
    with pytest.raises(KeyboardInterrupt):
        _fit(demo(run_name="cut", epochs=4, lr=0.05), stop_after=2)
    capsys.readouterr()
    resumed = _fit(demo(run_name="cut", epochs=4, lr=0.05))
    out = capsys.readouterr().out
    path = results / "demo" / "ckpt" / "cut" / "epoch-0002.pt"
    assert f"resuming demo from epoch 2 of 4 ({path})" in out
    assert resumed["start"] == 2 and full["start"] == 0
    assert len(resumed["losses"]) == len(full["losses"])
    np.testing.assert_allclose(resumed["losses"], full["losses"], rtol=0, atol=1e-7)
    assert torch.allclose(resumed["weight"], full["weight"], atol=1e-7)


def test_corrupt_checkpoint_names_the_file_and_fresh_starts_over(results):
    _fit(demo(run_name="bad", epochs=1, lr=0.05))
    path = results / "demo" / "ckpt" / "bad" / "epoch-0001.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="epoch-0001.pt is unreadable"):
        with pytest.raises(training.CheckpointError) as e:
            _fit(demo(run_name="bad", epochs=2, lr=0.05))
    msg = str(e.value)
    assert str(path) in msg and "Run again with --fresh (or fresh=True) to start over" in msg
    assert "weights_only" not in msg
    again = _fit(demo(run_name="bad", epochs=2, lr=0.05, fresh=True))
    assert again["start"] == 0 and len(again["losses"]) == 2 * (demo().n_train // demo().global_batch)
    assert sorted(p.name for p in path.parent.glob("*.pt")) == ["epoch-0001.pt", "epoch-0002.pt"]


def test_write_result_on_rank_zero_only(tmp_path):
    p = run_ranks(2, "case_skeleton_write_result", env={"DDLCOURSE_RESULTS": str(tmp_path)})
    assert "WROTE [True, False]" in p.stdout
    files = list((tmp_path / "demo").glob("*.json"))
    assert [f.name for f in files] == ["result-r0.json"]
    assert json.loads(files[0].read_text()) == {"rank": 0, "t": [1.5, 2.0], "a": [0, 1, 2], "x": 0.5, "n": {"k": 4}}


# --------------------------------------------------------------------------- device and timers
def _ctx(device) -> training.RunContext:
    return training.RunContext(rank=0, world_size=1, device=torch.device(device), backend="ddp", comm=None)


def test_to_moves_nested_batches_and_leaves_the_rest():
    ctx = _ctx("meta")                                      # a device that is not the CPU, on any machine
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"images": torch.zeros(2, 3), "pair": Pair(torch.ones(1), [torch.ones(2), 7]),
             "ids": np.arange(3), "name": "b0"}
    out = ctx.to(batch)
    assert out["images"].device.type == "meta" and out["images"].shape == (2, 3)
    assert isinstance(out["pair"], Pair) and out["pair"].x.device.type == "meta"
    assert isinstance(out["pair"].y, list) and out["pair"].y[0].device.type == "meta" and out["pair"].y[1] == 7
    assert out["ids"] is batch["ids"] and out["name"] == "b0"
    assert batch["images"].device.type == "cpu"             # the input is not changed
    assert ctx.to(torch.nn.Linear(2, 2)).weight.device.type == "meta"


def test_wrap_refuses_a_model_on_another_device():
    with pytest.raises(RuntimeError, match="ctx.to"):
        _ctx("meta").wrap(torch.nn.Linear(2, 2), None)


def test_numpy_goes_through_the_cpu():
    t = torch.ones(2, requires_grad=True) * 3
    assert training.RunContext.numpy(t).tolist() == [3.0, 3.0]


def test_timers_synchronise_a_cuda_device(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    gpu = _ctx("cuda:0")
    with gpu.timer() as t:
        pass
    assert len(calls) == 2 and calls[0] == torch.device("cuda:0") and t.seconds >= 0
    calls.clear()
    with _ctx("cpu").timer():
        pass
    assert calls == []


# --------------------------------------------------------------------------- process groups
def test_mesh_groups_are_built_once_and_reused():
    out = run_ranks(4, "case_skeleton_mesh_groups").stdout
    assert out.split() == ["OK0", "OK1", "OK2", "OK3"], out


def test_horovod_runs_on_a_mesh_but_will_not_average_model_parts():
    """Spatial ranks (seismic) hold whole models: horovod may run on a mesh. Model parts may not be averaged."""
    out = run_ranks(4, "case_skeleton_horovod_on_a_mesh").stdout
    assert out.count("refused: Horovod averages gradients over all ranks") == 4, out


def test_bad_mesh_is_refused():
    with pytest.raises(ConfigError, match="mp=3 must divide"):
        training._mesh_shape((None, 3), 4)
    with pytest.raises(ConfigError, match="has 6 places"):
        training._mesh_shape((3, 2), 4)


# --------------------------------------------------------------------------- the command line
def test_dispatcher_refuses_unknown_case_and_backend(capsys):
    with pytest.raises(cases.CaseError, match="unknown case 'wheat'; available cases: .*maize"):
        cases.get_case("wheat")
    assert training.cli.main(["wheat", "--scale", "smoke"]) == 2
    assert "unknown case 'wheat'; available cases: " in capsys.readouterr().err
    assert training.cli.main(["maize", "--scale", "smoke", "--backend", "mpi"]) == 2
    assert "unknown backend 'mpi'" in capsys.readouterr().err


def test_case_cli_messages(results, capsys):
    from ddlcourse.cases import topology
    assert training.case_cli(topology, ["epochs=-3"], scale="smoke") == 2
    assert "topology: error: epochs=-3: must be >= 0" in capsys.readouterr().err
    assert training.case_cli(topology, ["epoch=3"], scale="smoke") == 2
    err = capsys.readouterr().err
    assert "unknown topology setting(s) epoch; known settings:" in err and "global_batch" in err
    assert training.case_cli(topology, ["lr=abc"], scale="smoke") == 2
    assert "lr=abc: expected a number" in capsys.readouterr().err
    assert training.case_cli(topology, ["--help"], scale="smoke") == 0
    assert "global_batch" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["maize", "epochs=-3"], "unknown maize setting(s) epochs"),
    (["maize", "seg_epochs=-3"], "seg_epochs=-3: must be >= 1"),
    (["wheat"], "unknown case 'wheat'"),
    (["maize", "--backend", "mpi"], "unknown backend 'mpi'"),
])
def test_command_line_bad_input_exits_2(args, message, tmp_path, monkeypatch, capsys):
    """The words are checked before anything runs, so ``python -m ddlcourse``'s main() is called here, in this
    process (tests/test_training_cli.py also runs the real command line): status 2, the message, no exception."""
    from ddlcourse import __main__ as ddl
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    assert ddl.main(["run", *args[:1], "--scale", "smoke", *args[1:]]) == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- the shared homes of what cases repeated
def test_run_comparisons_and_timeline_events():
    from ddlcourse import integrity, plots_timeline
    ref = [1.0, 0.5, 0.25]
    assert integrity.max_rel_diff([1.1, 0.5, 0.25], ref) == pytest.approx(0.1)
    assert integrity.losses_agree(ref, [1.0, 0.5, 0.25 + 1e-7]) and not integrity.losses_agree(ref, [1.0, 0.5])
    assert not integrity.losses_agree(ref, [1.0, 0.5, 0.26])
    assert integrity.compare_runs({1: ref, 2: list(ref), 4: [2.0, 1.0, 0.5]}, check=integrity.losses_agree) == \
        {2: True, 4: False}
    ev = plots_timeline.relative_events([(1, "H", 0, 10.5, 10.75), {"rank": 0, "kind": "F", "micro_batch": 2,
                                                                     "start": 10.0, "stop": 10.5}], t0=10.0)
    assert ev == [{"rank": 1, "kind": "H", "micro_batch": 0, "start": 0.5, "stop": 0.75},
                  {"rank": 0, "kind": "F", "micro_batch": 2, "start": 0.0, "stop": 0.5}]
    assert [e["rank"] for e in plots_timeline.gather_events(ev, None)] == [0, 1]
    ax = plots_timeline.plot_timeline(ev)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "head"]
    with pytest.raises(ValueError, match="rank, kind, micro_batch, start, stop"):
        plots_timeline.as_event((0, "F", 1.0))
