"""A case's settings: one dataclass per case, built from a scale profile, overridden by validated ``key=value``.

Every value is coerced to its field's type and range-checked when the config is built, so a config that
exists is a config that makes sense. The scale and the backend are checked here, once, for every path in
(a notebook's ``Config.make``, the command line, ``dataclasses.replace``).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import ClassVar

import numpy as np

from ddlcourse import config as scales
from ddlcourse.parallel.data_parallel import BACKENDS     # the one list: the backends wrap() implements


class ConfigError(ValueError):
    """A setting that does not exist, has the wrong type or is out of range."""


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def type_name(tp) -> str:
    """How a setting's type reads in messages and in ``--help``: ``int``, ``list[int]``, ``str | None``."""
    if typing.get_origin(tp) is not None:             # list[int], int | None: __name__ would say only "list"
        return str(tp).replace("typing.", "").replace("NoneType", "None")
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def check_scale(scale: str | None) -> str:
    """The scale profile's name (``None``: ``$DDLCOURSE_SCALE`` or laptop), or a :class:`ConfigError`."""
    try:
        return scales.get_scale(scale)
    except scales.ScaleError as e:
        raise ConfigError(str(e)) from None


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else a :class:`ConfigError` that lists them."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def coerce(name: str, value, tp):
    """``value`` as the type ``tp`` of the setting ``name`` (strings from the command line are parsed)."""
    shown = value if isinstance(value, str) else repr(value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return coerce(name, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else
                          f"{name}={shown}: expected one of {', '.join(type_name(a) for a in args)}")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.strip().strip("[]()").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={shown}: expected a list, e.g. {name}=1,2,3")
        elem = args[0] if args else typing.Any
        try:
            return origin(coerce(name, v.strip() if isinstance(v, str) else v, elem) for v in value)
        except ConfigError:
            raise ConfigError(f"{name}={shown}: expected a list of {type_name(elem)}") from None
    if tp is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{name}={shown}: expected true or false")
    if tp is int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{name}={shown}: expected a whole number")
    if tp is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value.strip())
            except ValueError:
                raise ConfigError(f"{name}={shown}: expected a number, e.g. {name}=1e-3") from None
        else:
            raise ConfigError(f"{name}={shown}: expected a number")
        if not math.isfinite(out):
            raise ConfigError(f"{name}={shown}: expected a finite number")
        return out
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}={shown}: expected text")
    return value                                   # any other annotation: taken as given


def setting(default=dataclasses.MISSING, *, help: str = "", min=None, above=None, choices=None,
            default_factory=dataclasses.MISSING):
    """A case's setting, declared with its rule and its ``--help`` text::

        epochs: int = setting(min=1, help="passes over the training set")       # no default: the scale gives it
        lr: float = setting(above=0, help="Adam's learning rate")
        model: str = setting("3d", choices=("2d", "3d"), help="U-Net on sections or on cubes")

    ``min``: the value (each element of a list) must be ``>= min``; ``above``: ``> above``; ``choices``: one of
    them. None passes every rule (a setting whose type allows None means "off"). The rules are checked whenever a
    config is built (:meth:`CaseConfig.validate`); ``python -m ddlcourse run CASE --help`` shows ``help``."""
    meta = {"help": help, "min": min, "above": above, "choices": tuple(choices) if choices else None}
    return field(default=default, default_factory=default_factory, metadata=meta)


def _rule_error(name: str, value, meta) -> str | None:
    """What is wrong with ``value`` by the rules of its field (``meta``), or None."""
    if value is None:
        return None
    if meta.get("choices") and value not in meta["choices"]:
        return f"unknown {name} {value!r}; choose one of {', '.join(map(str, meta['choices']))}"
    for v in (value if isinstance(value, (list, tuple)) else [value]):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if meta.get("min") is not None and v < meta["min"]:
            return f"{name}={value}: must be >= {meta['min']}"
        if meta.get("above") is not None and v <= meta["above"]:
            return f"{name}={value}: must be > {meta['above']}"
    return None


@dataclass(kw_only=True)
class CaseConfig:
    """The run options every case shares; a case subclasses it with its own fields (see :mod:`ddlcourse.training`).

    Make one with :meth:`make` (the sizes of the case's scale section, then overrides). Building one in any way
    (``make``, the constructor, :func:`dataclasses.replace`) coerces every value to its field's type and runs
    :meth:`validate`.
    """

    CASE: ClassVar[str] = "case"
    SECTION: ClassVar[str | None] = None

    scale: str = setting(default_factory=lambda: scales.get_scale(), help="the scale profile the sizes come from")
    backend: str = setting("ddp", help=f"how gradients are averaged: {', '.join(BACKENDS)}")
    ranks: int | None = setting(None, min=1, help="train on the first `ranks` MPI ranks (scaling in one cluster); "
                                                  "none: all of them")
    seed: int = setting(0, min=0, help="the seed of the model, the data order and the data")
    run_name: str = setting("default", help="checkpoints and results are kept per run name")
    fresh: bool = setting(False, help="clear this run's checkpoints and start at epoch 0")

    def __post_init__(self):
        # The one conversion of every value, whatever the way in (make, the constructor, dataclasses.replace, the
        # command line's strings): to the field's type, then the rules.
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.init:
                setattr(self, f.name, coerce(f.name, getattr(self, f.name), hints.get(f.name, typing.Any)))
        self.validate()

    def validate(self) -> None:
        """The rules declared on the fields (:func:`setting`), and those of every case; a case extends this
        (call ``super().validate()``) with the rules that tie settings together."""
        self.scale = check_scale(self.scale)
        check_backend(self.backend)
        if not self.run_name or any(c in self.run_name for c in "/\\") or self.run_name.startswith("."):
            raise ConfigError(f"run_name={self.run_name!r}: must be a plain folder name (no '/', not starting with '.')")
        for f in dataclasses.fields(self):
            problem = _rule_error(f.name, getattr(self, f.name), f.metadata)
            if problem:
                raise ConfigError(problem)

    @classmethod
    def help_of(cls, name: str) -> str:
        """The ``--help`` text of setting ``name``."""
        return next(f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == name)

    @classmethod
    def settings(cls) -> list[str]:
        """The names a user may set (``key=value``)."""
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def types(cls) -> dict[str, object]:
        """Each setting's type (its annotation)."""
        hints = typing.get_type_hints(cls)
        return {k: hints.get(k, typing.Any) for k in cls.settings()}

    @classmethod
    def scale_defaults(cls, sizes: SimpleNamespace) -> dict:
        """The values a scale gives this config: the sizes of its section that it declares. A case whose
        defaults follow from the sizes (topology's ``base_batch``) extends this."""
        names = set(cls.settings())
        return {k: v for k, v in vars(sizes).items() if k in names}

    @classmethod
    def make(cls, scale: str | None = None, /, **overrides):
        """This case's config: the sizes of its section at ``scale``, then the validated ``overrides``
        (``seismic.Config.make("smoke", epochs=1)``; ``scale=...`` among the overrides works too)."""
        return make_config(cls, cls.SECTION, scale, **overrides)


def unknown_settings(cls, keys) -> ConfigError:
    """The error for settings ``cls`` does not have; it names every one it has."""
    return ConfigError(f"unknown {cls.CASE} setting(s) {', '.join(sorted(keys))}; "
                       f"known settings: {', '.join(sorted(cls.settings()))}")


def make_config(cls, section: str | None = None, scale: str | None = None, /, **overrides):
    """``cls`` with the sizes of ``section`` (default ``cls.SECTION``) at ``scale``, then ``overrides``.

    Section sizes that ``cls`` does not declare (sizes of the notebook only, such as ``n_engines``) are left out.
    Unknown overrides, values of the wrong type and values out of range raise :class:`ConfigError`.
    """
    section = section or cls.SECTION
    unknown = set(overrides) - set(cls.settings())
    if unknown:
        raise unknown_settings(cls, unknown)
    if "scale" in overrides:                       # scale=S among the settings picks the sizes too
        given = overrides.pop("scale")
        if scale is not None and check_scale(given) != check_scale(scale):
            raise ConfigError(f"two scales: {scale!r} and scale={given!r}; give one")
        scale = given
    base = {"scale": check_scale(scale)}
    if section:
        try:
            s = scales.sizes(section, base["scale"])
        except scales.ScaleError as e:             # a section that does not exist: the case's own mistake
            raise ConfigError(str(e)) from None
        base.update(cls.scale_defaults(s))
    return cls(**{**base, **overrides})


def parse_overrides(cls, items: list[str]) -> dict:
    """``["epochs=3", "lr=1e-3"]`` -> ``{"epochs": "3", "lr": "1e-3"}``: the words of the command line, split and
    checked against the settings of ``cls``; the config converts them (once, with every other value)."""
    names = set(cls.settings())
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {item!r} (e.g. epochs=3)")
        if key not in names:
            raise unknown_settings(cls, [key])
        out[key] = value
    return out
