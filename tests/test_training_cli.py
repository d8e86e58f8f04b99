"""The one command line of the cases (ddlcourse.training.cli): ``python -m ddlcourse run CASE [--scale S]
[--backend B] [--fresh] [key=value ...]``, parsed once, validated once by the case's config; ``--help`` after a
case prints every setting with its type and its value at the chosen scale."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ddlcourse import __main__ as ddl
from ddlcourse import cases, config, training
from ddlcourse.cases import seismic, topology
from ddlcourse.parallel import data_parallel
from ddlcourse.training.cli import cli_value, parse_args


def settings_table(out: str, with_help: bool = False) -> dict[str, tuple]:
    """``{setting: (type, value)}`` (``with_help``: ``(type, value, what it is)``) from the table that ``--help``
    prints under its ``setting type value what it is`` header."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^\s+setting\s+type\s+value\s+what it is$", line))
    rows = {}
    for line in lines[start + 1:]:
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) not in (3, 4):
            break
        rows[parts[0]] = (parts[1], parts[2], parts[3] if len(parts) == 4 else "")[:3 if with_help else 2]
    return rows


@pytest.mark.parametrize("case", cases.available())
def test_help_says_what_every_setting_is(capsys, case):
    """The settings' descriptions are declared on their fields (training.setting) and shown by --help."""
    rc, out, _ = run(capsys, case, "--scale", "smoke", "--help")
    assert rc == 0
    cfg = cases.get_case(case).Config
    table = settings_table(out, with_help=True)
    assert {k: v[2] for k, v in table.items()} == {k: cfg.help_of(k) for k in cfg.settings()}
    assert all(cfg.help_of(k) for k in cfg.settings()), [k for k in cfg.settings() if not cfg.help_of(k)]


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = ddl.main(["run", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# --------------------------------------------------------------------------- --help
@pytest.mark.parametrize("scale", ["smoke", "laptop"])
def test_help_lists_every_setting_with_its_type_and_its_value_at_the_scale(capsys, scale):
    rc, out, _ = run(capsys, "seismic", "--scale", scale, "--help")
    assert rc == 0
    table = settings_table(out)
    cfg = seismic.Config.make(scale, run_name=training.cli.DEFAULT_RUN_NAME)    # the values a run would use
    assert list(table) == cfg.settings()
    assert table["epochs"] == ("int", str(cfg.epochs))
    for k, tp in cfg.types().items():
        assert table[k] == (training.type_name(tp), cli_value(getattr(cfg, k))), k
    assert f"settings at scale {scale}; set any of them with key=value" in out
    assert re.search(rf"e\.g\. python -m ddlcourse run seismic --scale {scale} epochs=\d+$", out, re.M), out


def test_the_scale_changes_the_values_shown():
    """The two scales above show different numbers where the profile has different numbers."""
    smoke, laptop = seismic.Config.make("smoke"), seismic.Config.make("laptop")
    assert smoke.epochs != laptop.epochs and smoke.n_volumes != laptop.n_volumes


def test_help_shows_a_value_set_on_the_command_line_and_takes_options_in_any_order(capsys):
    rc, out, _ = run(capsys, "seismic", "--help", "epochs=5", "cube=64,8,8", "--scale=smoke", "--backend", "allreduce")
    assert rc == 0
    table = settings_table(out)
    assert table["epochs"] == ("int", "5") and table["cube"] == ("list[int]", "64,8,8")
    assert table["backend"][1] == "allreduce" and table["scale"][1] == "smoke"


def test_help_from_the_real_command_line():
    p = subprocess.run([sys.executable, "-m", "ddlcourse", "run", "seismic", "--scale", "laptop", "--help"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert settings_table(p.stdout)["epochs"] == ("int", str(seismic.Config.make("laptop").epochs))


def test_run_without_a_case(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and f"cases: {', '.join(cases.available())}" in out
    rc, _, err = run(capsys)
    assert rc == 2 and "which case?" in err


# --------------------------------------------------------------------------- one validation, clear messages
def test_unknown_setting_names_every_valid_one(capsys):
    rc, _, err = run(capsys, "seismic", "--scale", "smoke", "epoch=3")
    assert rc == 2 and "seismic: error: unknown seismic setting(s) epoch; known settings: " in err
    known = err.split("known settings: ")[1].strip().split(", ")
    assert known == sorted(seismic.Config.settings())


def test_unknown_backend_lists_the_one_backend_list(capsys):
    assert training.BACKENDS is data_parallel.BACKENDS          # the list the backends are implemented for
    for argv in (["--backend", "mpi"], ["backend=mpi"], ["--backend", "mpi", "--help"]):
        rc, _, err = run(capsys, "seismic", "--scale", "smoke", *argv)
        assert rc == 2, argv
        assert f"unknown backend 'mpi'; choose one of {', '.join(training.BACKENDS)}" in err, err
    from ddlcourse.cases import seismic
    cfg = seismic.Config.make("smoke")
    cfg.backend = "mpi"                                         # past the config's own check
    with pytest.raises(training.ConfigError, match="unknown backend 'mpi'"):
        training.setup(cfg)                                     # the run context checks the same list


def test_unknown_scale_lists_the_scales(capsys):
    for argv in (["--scale", "huge"], ["--scale", "huge", "--help"], ["scale=huge"]):
        rc, _, err = run(capsys, "seismic", *argv)
        assert rc == 2, argv
        assert "unknown scale 'huge'" in err and ", ".join(config.SCALES) in err, err


def test_unknown_option_and_malformed_words(capsys):
    rc, _, err = run(capsys, "seismic", "--scale", "smoke", "--epochs", "3")
    assert rc == 2 and "unknown option '--epochs'" in err and "key=value" in err
    rc, _, err = run(capsys, "seismic", "--scale", "smoke", "epochs")
    assert rc == 2 and "expected key=value, got 'epochs'" in err
    rc, _, err = run(capsys, "seismic", "--scale")
    assert rc == 2 and "--scale needs a value" in err
    rc, _, err = run(capsys, "seismic", "--scale", "smoke", "--backend", "ddp", "backend=horovod")
    assert rc == 2 and "two backends" in err


def test_parse_args_sorts_the_words_and_checks_nothing_else():
    a = parse_args(["maize", "--fresh", "seg_epochs=2", "--scale=laptop", "--backend", "horovod", "x=1", "--what"])
    assert (a.case, a.scale, a.backend, a.fresh, a.help) == ("maize", "laptop", "horovod", True, False)
    assert a.settings == ["seg_epochs=2", "x=1"] and a.unknown == ["--what"]
    b = parse_args(["epochs=2", "-h"], case="seismic")           # case_cli: the case is known already
    assert (b.case, b.settings, b.help) == ("seismic", ["epochs=2"], True)


# --------------------------------------------------------------------------- Config.make, the one way to make a config
def test_config_make_is_the_scale_section_then_the_overrides():
    cfg = seismic.Config.make("smoke", epochs=1)
    s = config.sizes("lab_seismic", "smoke")
    assert (cfg.scale, cfg.epochs, cfg.lr, cfg.cube) == ("smoke", 1, s.lr, s.cube)
    assert seismic.Config.make(scale="smoke") == training.make_config(seismic.Config, None, "smoke")
    assert seismic.Config.make(None, scale="laptop").n_volumes == config.sizes("lab_seismic", "laptop").n_volumes
    with pytest.raises(training.ConfigError, match="two scales"):
        seismic.Config.make("smoke", scale="laptop")


def test_a_case_may_derive_defaults_from_its_scale():
    """topology's base_batch (of the lr scaling rule) is the scale's global batch, not the overridden one."""
    scale_batch = config.sizes("topology", "smoke").global_batch
    assert topology.Config.make("smoke").base_batch == scale_batch
    cfg = topology.Config.make("smoke", global_batch=2 * scale_batch)
    assert (cfg.global_batch, cfg.base_batch) == (2 * scale_batch, scale_batch)
    assert topology.Config.make("smoke", base_batch=4).base_batch == 4


def test_cases_keep_only_their_science():
    """No case carries its own make_config or cli wrapper: the config is Config.make, the CLI the one above."""
    for name in cases.available():
        mod = cases.get_case(name)
        assert issubclass(mod.Config, training.CaseConfig) and callable(mod.train), name
        assert not hasattr(mod, "make_config") and not hasattr(mod, "cli"), name


def test_case_cli_takes_the_same_words(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_RESULTS", str(tmp_path))
    assert training.case_cli(seismic, ["--help", "epochs=3"], scale="smoke") == 0
    assert settings_table(capsys.readouterr().out)["epochs"] == ("int", "3")
    assert training.case_cli(seismic, ["--scale", "huge"], scale="smoke") == 2     # the words win over the default
    assert "unknown scale 'huge'" in capsys.readouterr().err


def test_the_environment_scale_is_the_default(capsys, monkeypatch):
    monkeypatch.setenv("DDLCOURSE_SCALE", "laptop")
    rc, out, _ = run(capsys, "seismic", "--help")
    assert rc == 0 and settings_table(out)["scale"] == ("str", "laptop")
    monkeypatch.setenv("DDLCOURSE_SCALE", "huge")
    rc, _, err = run(capsys, "seismic", "--help")
    assert rc == 2 and "unknown scale 'huge' (from $DDLCOURSE_SCALE)" in err
