"""The command line of every case, parsed here once and validated once (by the case's config)::

    python -m ddlcourse run CASE [--scale S] [--backend B] [--fresh] [key=value ...]
    python -m ddlcourse run CASE --scale laptop --help      # every setting, its type and its value at laptop

Run it under ``mpiexec -n N`` or ``srun``: every rank parses the same words and builds the same config, so a
mistake is found on every rank before any work, and said once (by rank 0).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ddlcourse import cases, dist
from ddlcourse.config import SCALES
from ddlcourse.training.checkpoint import CheckpointError
from ddlcourse.training.config import BACKENDS, ConfigError, parse_overrides, type_name
from ddlcourse.training.results import summary, to_json

PROG = "python -m ddlcourse run"
DEFAULT_BACKEND = "ddp"          # the command line's, whatever a case's notebook prefers (maize: horovod)
DEFAULT_RUN_NAME = "cli"         # keeps command-line runs apart from the notebooks' checkpoints
OPTIONS = ("--scale", "--backend", "--fresh", "-h", "--help")


@dataclass
class RunArgs:
    """The words of one command line, sorted; nothing is checked here but their form."""

    case: str | None = None
    scale: str | None = None
    backend: str | None = None
    fresh: bool = False
    help: bool = False
    settings: list[str] = field(default_factory=list)      # key=value, in the order given
    unknown: list[str] = field(default_factory=list)       # options that do not exist


def parse_args(argv: list[str], case: str | None = None) -> RunArgs:
    """``[CASE] [--scale S] [--backend B] [--fresh] [-h] [key=value ...]`` in any order (``--scale=S`` too).

    The first word that is neither an option nor ``key=value`` names the case, unless ``case`` is given.
    """
    a = RunArgs(case=case)
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, value = word.partition("=")
        if word in ("-h", "--help"):
            a.help = True
        elif word == "--fresh":
            a.fresh = True
        elif name in ("--scale", "--backend"):
            if not eq:
                i += 1
                if i == len(argv) or argv[i].startswith("-"):
                    choices = SCALES if name == "--scale" else BACKENDS
                    raise ConfigError(f"{name} needs a value: one of {', '.join(choices)}")
                value = argv[i]
            setattr(a, name[2:], value)
        elif word.startswith("-"):
            a.unknown.append(word)
        elif a.case is None and "=" not in word:
            a.case = word
        else:
            a.settings.append(word)
        i += 1
    return a


def config_from_args(Config, args: RunArgs):
    """The case's config from the command line: its scale section at ``--scale``, then the settings.

    The one place where the command line's words become values; every check is the config's own.
    """
    if args.unknown:
        raise ConfigError(f"unknown option {args.unknown[0]!r}: the options are {', '.join(OPTIONS)}; settings "
                          f"are given as key=value (e.g. epochs=3); known settings: "
                          f"{', '.join(sorted(Config.settings()))}")
    over = parse_overrides(Config, args.settings)
    if args.backend is not None:
        if over.get("backend", args.backend) != args.backend:
            raise ConfigError(f"two backends: --backend {args.backend} and backend={over['backend']}; give one")
        over["backend"] = args.backend
    over.setdefault("backend", DEFAULT_BACKEND)
    if args.fresh:
        over["fresh"] = True
    over.setdefault("run_name", DEFAULT_RUN_NAME)
    return Config.make(args.scale, **over)


# --------------------------------------------------------------------------- help
def _options() -> list[str]:
    return ["options:",
            f"  --scale S      the scale profile: {', '.join(SCALES)} (default: $DDLCOURSE_SCALE, else laptop)",
            f"  --backend B    how gradients are averaged: {', '.join(BACKENDS)} (default: {DEFAULT_BACKEND})",
            "  --fresh        clear this run's checkpoints and start at epoch 0 (the same as fresh=true)",
            "  -h, --help     this text; after a case, its settings and their values at --scale"]


def usage() -> str:
    """``python -m ddlcourse run --help``: the form of the command and the cases."""
    return "\n".join([f"usage: {PROG} CASE [--scale S] [--backend B] [--fresh] [key=value ...]", "",
                      "Train a case study on every rank (start it with mpiexec -n N or srun).", "",
                      f"cases: {', '.join(cases.available())}", "", *_options(), "",
                      f"{PROG} CASE --help lists the case's settings, e.g. {PROG} seismic --scale laptop --help"])


def cli_value(v) -> str:
    """A value as it is typed on the command line (``cube=64,16,16``, ``init_from=none``, ``syncbn=true``)."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return ",".join(cli_value(x) for x in v)
    if isinstance(v, str):
        return v if v.strip() else repr(v)
    return repr(v)


def _example(cfg) -> str:
    """One setting to show how settings are set: the epochs, doubled, where the case has them."""
    names = cfg.settings()
    name = next((k for k in names if k == "epochs"), None) or next((k for k in names if k.endswith("epochs")),
                                                                   None)
    if name is None:
        return "seed=1"
    return f"{name}={2 * getattr(cfg, name) or 1}"


def settings_help(mod, cfg) -> str:
    """``python -m ddlcourse run CASE --help``: every setting, its type, its value in ``cfg`` and what it does."""
    case, types = cfg.CASE, cfg.types()
    doc = (mod.__doc__ or "").strip().splitlines()
    rows = [(k, type_name(types[k]), cli_value(getattr(cfg, k)), cfg.help_of(k)) for k in cfg.settings()]
    wk, wt = max(len(r[0]) for r in rows + [("setting", "", "", "")]), max(len(r[1]) for r in rows)
    wv = min(max(len(r[2]) for r in rows + [("", "", "value", "")]), 16)
    return "\n".join([
        f"usage: {PROG} {case} [--scale S] [--backend B] [--fresh] [key=value ...]", "",
        *(doc[:1] + [""] if doc else []), *_options(), "",
        f"settings at scale {cfg.scale}; set any of them with key=value, "
        f"e.g. {PROG} {case} --scale {cfg.scale} {_example(cfg)}",
        f"  {'setting':<{wk}}  {'type':<{wt}}  {'value':<{wv}}  what it is",
        *(f"  {k:<{wk}}  {t:<{wt}}  {v:<{wv}}  {h}".rstrip() for k, t, v, h in rows)])


# --------------------------------------------------------------------------- running a case
def _say(text: str, err: bool = True) -> None:
    """Print once, on rank 0: every rank reaches the same verdict on the same words."""
    if dist.rank() == 0:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)


def run_case(mod, args: RunArgs) -> int:
    """Build the config of case module ``mod`` (``Config``, ``train``, optionally ``summary``), then print
    its settings (``--help``) or train and print the summary on rank 0. Returns the exit status: 0, or 2
    with one clear message for bad settings, data or checkpoints."""
    name = mod.Config.CASE
    try:
        cfg = config_from_args(mod.Config, args)
    except ValueError as e:
        _say(f"{name}: error: {e}")
        return 2
    if args.help:
        _say(settings_help(mod, cfg), err=False)
        return 0
    try:
        res = mod.train(cfg)
    except (ValueError, FileNotFoundError, CheckpointError) as e:   # bad data, settings or checkpoint
        print(f"{name}: error (rank {dist.rank()}): {e}", file=sys.stderr)
        return 2
    if res is not None and dist.rank() == 0:
        print(to_json(getattr(mod, "summary", summary)(res)))
    return 0


def case_cli(mod, argv: list[str], scale: str | None = None, backend: str | None = None) -> int:
    """The command line of the case module ``mod`` without its name: ``case_cli(seismic, ["epochs=2"],
    scale="smoke")``. ``scale``/``backend`` stand where ``--scale``/``--backend`` are not in ``argv``."""
    try:
        args = parse_args(argv, case=mod.Config.CASE)
    except ValueError as e:
        _say(f"{mod.Config.CASE}: error: {e}")
        return 2
    args.scale = args.scale if args.scale is not None else scale
    args.backend = args.backend if args.backend is not None else backend
    return run_case(mod, args)


def main(argv: list[str]) -> int:
    """``python -m ddlcourse run ...`` (the words after ``run``): find the case, then :func:`run_case`."""
    try:
        args = parse_args(argv)
        if args.case is None and args.help:
            _say(usage(), err=False)
            return 0
        if args.case is None:
            raise ConfigError(f"which case? e.g. {PROG} seismic --help\n\n{usage()}")
        mod = cases.get_case(args.case)
    except ValueError as e:
        _say(f"{PROG}: error: {e}")
        return 2
    try:
        return run_case(mod, args)
    finally:
        dist.shutdown()      # destroy the process group (and Horovod) before the interpreter exits
