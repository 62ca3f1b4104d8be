"""What each mechanism costs the simulated jobs (`Overheads`): the documented guesses, or the figures
measured on the real cluster (benchmarks/results/requeue.json; see sim/engine.py for how they are charged).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.plan import Action

REQUEUE_RESULTS = Path("benchmarks") / "results" / "requeue.json"


@dataclass(frozen=True)
class Overheads:
    """Seconds without progress that each mechanism costs (see the module docstring).

    The guesses (`source="guess"`) stand in until benchmarks/results/requeue.json holds figures
    measured on the real cluster; `migrate`, `resize` and `pack` default to suspend + resume.
    """

    start: float = 0.0
    suspend: float = 5.0
    resume: float = 10.0
    migrate: float | None = None
    resize: float | None = None
    pack: float | None = None
    finish: float = 0.0  # a finished job holds its GPUs this long after its last sample (process exit)
    crowd: float = 0.0  # extra start-up per other job starting in the same round (shared CPUs, disks)
    per_gpu: float = 0.0  # extra start-up per GPU beyond the first (one training process per GPU)
    launch: float = 0.0  # decision -> Slurm runs the job: the controller counts service from then
    park: float = 0.1  # park request -> parked, its GPUs free (co-held switch, `SimConfig.park`)
    unpark: float = 0.2  # unpark request -> training again on the GPUs it co-holds
    source: str = "guess"

    def cost(self, action: Action) -> float:
        """Dead time of the job that undergoes `action`."""
        both = self.suspend + self.resume
        if action is Action.START:
            return self.start
        if action is Action.RESUME:
            return self.resume
        if action is Action.RESIZE:
            return self.resize if self.resize is not None else both
        if action in (Action.PACK, Action.UNPACK):
            return self.pack if self.pack is not None else both
        if action is Action.MIGRATE:
            return self.migrate if self.migrate is not None else both
        return self.unpark if action is Action.UNPARK else 0.0

    @staticmethod
    def from_file(path: str | Path) -> Overheads:
        """Read measured costs: top-level keys start/suspend/resume/migrate/resize/pack/finish/crowd/per_gpu/launch
        and park/unpark, each a number of seconds or an object with one of median, p50, mean, seconds (first
        found wins)."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read overheads from {p}: {exc}; fix or remove the file") from exc
        if isinstance(data, dict) and isinstance(data.get("overheads"), dict):
            data = data["overheads"]
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a JSON object of overheads")
        values: dict[str, float] = {}
        keys = ("start", "suspend", "resume", "migrate", "resize", "pack", "finish", "crowd", "per_gpu", "launch")
        for key in (*keys, "park", "unpark"):
            v = data.get(key, data.get(f"{key}_s"))
            if isinstance(v, dict):
                v = next((v[k] for k in ("median", "p50", "mean", "seconds") if k in v), None)
            if v is None:
                continue
            if not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"{p}: overhead {key} must be a number of seconds >= 0, got {v!r}")
            values[key] = float(v)
        return replace(Overheads(), source=str(p), **values)  # type: ignore[arg-type]

    @staticmethod
    def default(search: Iterable[Path] | None = None) -> Overheads:
        """Measured figures from the first requeue.json found under `search` (default: the current
        directory, then the source checkout this package runs from), else the guesses."""
        if search is None:
            search = (Path.cwd(), Path(__file__).resolve().parents[2])
        for base in search:
            cand = base / REQUEUE_RESULTS
            if cand.is_file():
                return Overheads.from_file(cand)
        return Overheads()
