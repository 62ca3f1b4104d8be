"""The policy interface: one pure method from a view to a plan."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from slurm_gandiva.model import ClusterView
from slurm_gandiva.plan import Plan


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy. No clock, files, database or Slurm inside: everything comes in `view`."""

    name: str

    def decide(self, view: ClusterView, now: float) -> Plan: ...
