"""Pure scheduling policies shared verbatim by the controller and the simulator.

`make_policy(name, **params)` builds one by name; `POLICY_NAMES` lists the names. Every policy has
`name`, `decide(view, now) -> Plan`, `quantum` (seconds between forced rounds while jobs wait, or
None when only events matter) and the class attribute `elastic` (True: the policy wants jobs with a
GPU range and may give any count in it; False: it runs jobs on their requested count, min_gpus).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import cast

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.selector.afs import AfsL, AfsP
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.baselines import Fifo, Slurm, Srtf, Tiresias
from slurm_gandiva.selector.gandiva import Default, Gandiva

POLICY_NAMES = ("slurm", "fifo", "srtf", "tiresias", "gandiva", "afs-l", "afs-p", "default")

_FACTORIES: dict[str, Callable[..., object]] = {
    "slurm": Slurm,
    "fifo": Fifo,
    "srtf": Srtf,
    "tiresias": Tiresias,
    "gandiva": Gandiva,
    "afs-l": AfsL,
    "afs-p": AfsP,
    "default": Default,
}


def _factory(name: str, params: Mapping[str, object]) -> Callable[..., object]:
    """The policy class called `name`; ConfigError for an unknown name or parameter."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown policy {name!r}: choose one of {', '.join(POLICY_NAMES)}")
    fields = {f.name for f in dataclasses.fields(factory) if f.init} - {"name"}  # type: ignore[arg-type]
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ConfigError(
            f"policy {name!r} has no parameter {', '.join(unknown)}: use one of {', '.join(sorted(fields))}"
        )
    return factory


def make_policy(name: str, **params: object) -> Policy:
    """The policy called `name` with its parameters overridden by `params`."""
    return cast(Policy, _factory(name, params)(**params))


# Parameters that must be positive (the rest of the numbers: zero or more; `seed`: any whole number).
_POSITIVE = frozenset(
    {"quantum", "trial_window", "lease", "threshold", "probe", "depth", "window", "max_age", "half_life", "calc_period"}
)
_CHOICES = {"fairshare": ("fair_tree", "classic", "off")}  # Slurm's fairshare modes (selector/baselines.py)
_FRACTION = frozenset({"pack_keep"})  # in (0, 1]
_FACTOR = frozenset({"overestimate"})  # 1 or more


def check_params(name: str, params: Mapping[str, object]) -> dict[str, object]:
    """`params` checked against the policy's parameters, their types and ranges, and converted (an int for
    a float parameter); ConfigError naming the first bad one. What a config file gives is str, int,
    float or bool."""
    hints = typing.get_type_hints(_factory(name, params))
    return {key: _checked(key, value, hints[key]) for key, value in params.items()}


def _checked(key: str, value: object, hint: object) -> object:
    kinds = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
    if value is None and type(None) in kinds:
        return None  # an optional parameter left unset (`--param quantum=none`; a config file has no null)
    kinds.discard(type(None))
    bad = f"policy parameter {key} = {value!r}"
    if kinds == {bool}:
        if not isinstance(value, bool):
            raise ConfigError(f"{bad} must be true or false")
        return value
    if kinds == {str}:
        if key in _CHOICES and str(value) not in _CHOICES[key]:
            raise ConfigError(f"{bad} must be one of {', '.join(_CHOICES[key])}")
        return str(value)
    if kinds == {int}:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{bad} must be a whole number")
        number: float = value
    elif kinds == {float}:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{bad} must be a number")
        number = float(value)
    else:
        return value
    if key in _FRACTION and not 0 < number <= 1:
        raise ConfigError(f"{bad} must be a fraction in (0, 1]")
    if key in _FACTOR and number < 1:
        raise ConfigError(f"{bad} must be at least 1")
    if key in _POSITIVE and number <= 0:
        raise ConfigError(f"{bad} must be positive")
    if key != "seed" and number < 0:
        raise ConfigError(f"{bad} must not be negative")
    return number if kinds == {float} else value


__all__ = ["POLICY_NAMES", "Policy", "check_params", "make_policy"]
