"""Pure scheduling policies shared verbatim by the controller and the simulator.

`make_policy(name, **params)` builds one by name; `POLICY_NAMES` lists the names. Every policy has
`name`, `decide(view, now) -> Plan`, `quantum` (seconds between forced rounds while jobs wait, or
None when only events matter) and the class attribute `elastic` (True: the policy wants jobs with a
GPU range and may give any count in it; False: it runs jobs on their requested count, min_gpus).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.selector.afs import AfsL, AfsP
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.baselines import Fifo, Srtf, Tiresias
from slurm_gandiva.selector.gandiva import Default, Gandiva

POLICY_NAMES = ("fifo", "srtf", "tiresias", "gandiva", "afs-l", "afs-p", "default")

_FACTORIES: dict[str, Callable[..., object]] = {
    "fifo": Fifo,
    "srtf": Srtf,
    "tiresias": Tiresias,
    "gandiva": Gandiva,
    "afs-l": AfsL,
    "afs-p": AfsP,
    "default": Default,
}


def make_policy(name: str, **params: object) -> Policy:
    """The policy called `name` with its parameters overridden by `params`."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown policy {name!r}: choose one of {', '.join(POLICY_NAMES)}")
    fields = {f.name for f in dataclasses.fields(factory) if f.init} - {"name"}  # type: ignore[arg-type]
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ConfigError(
            f"policy {name!r} has no parameter {', '.join(unknown)}: use one of {', '.join(sorted(fields))}"
        )
    return cast(Policy, factory(**params))


__all__ = ["POLICY_NAMES", "Policy", "make_policy"]
