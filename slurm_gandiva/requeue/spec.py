"""The submission contract between `gandiva sbatch` and the controller.

How the controller learns what a user asked for (elastic GPU range, model, total work) before the job's
first run:

1. `gandiva sbatch` submits the job HELD (`--hold`; the cluster's job_submit.lua holds marked jobs too),
   marked `--comment=gandiva:<private>`, on one node, WITHOUT ``--gres``. Before each start the controller sets the
   node list and per-GPU typed gres (``gpu:g0:1,gpu:g2:1`` whole, ``shard:g0:1,...`` packed); a job that
   has no gres yet may get either kind (Slurm 22.05 cannot switch a job between gpu and shard later).
2. Right after sbatch returns the job id, the submitter writes ``<private>/<job id>.json`` atomically
   (temporary file + rename), as the submitting user, in the submission's private directory under the
   jobs root, which the job's comment ``gandiva:<private>`` names (see `requeue.namespace`). Jobs marked
   plain ``gandiva`` (the old layout) have theirs in the shared ``<jobs root>/spec/<job id>.json``.
3. The same JSON is embedded in the batch script as one line ``# gandiva-spec: {...}`` (see
   `spec_from_script`), so the spec also travels with the job inside Slurm.

The controller calls `load_spec_file(namespace.job_paths(...).spec, job_id, owner=job.user)`. It returns
None while the file is missing (the job is held, so nothing is lost by waiting a tick); for a marked job
that has no spec after a grace period (plain `sbatch` of a script that calls gandiva-wrapper), use
`fallback_spec`, which makes a rigid job from the GPU count Slurm reports. A spec file not owned by the
job's user (or root) is refused: another user could pre-create a file for a job id that does not exist yet.

File format (version 1), all keys always present::

    {"version": 1, "job_id": "42", "user": "alice", "min_gpus": 1, "max_gpus": 4,
     "model": "resnet", "total_samples": 12800, "name": "train", "partition": "gpu",
     "signal": "USR2", "submitted": 1760000000.5, "command": ["python", "train.py"]}

Stdlib only. The job's other files (the wrapper's side) are in `contract.py`: the wrapper imports that one,
so it stays free of the model's types this module builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from slurm_gandiva.errors import JobFileError
from slurm_gandiva.model import JobSpec
from slurm_gandiva.requeue.contract import fsync_dir, write_atomic
from slurm_gandiva.requeue.safe_read import read_job_text

SPEC_VERSION = 1
SPEC_DIR = "spec"  # under the jobs root
SCRIPT_MARKER = "# gandiva-spec: "
SPEC_MODE = 0o644  # readable by all, writable by its submitter alone
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


@dataclass(frozen=True)
class SubmitSpec:
    """What the user asked for at submission; `total_samples` None means unknown."""

    job_id: str
    user: str
    min_gpus: int
    max_gpus: int
    model: str = ""
    total_samples: int | None = None
    name: str = ""
    partition: str = ""
    signal: str = "USR2"
    submitted: float = 0.0
    command: tuple[str, ...] = field(default_factory=tuple)
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        if self.min_gpus < 1 or self.max_gpus < self.min_gpus:
            raise ValueError(f"bad GPU range {self.min_gpus}:{self.max_gpus}")
        if self.total_samples is not None and self.total_samples < 1:
            raise ValueError(f"bad total_samples {self.total_samples}")

    @property
    def elastic(self) -> bool:
        return self.max_gpus > self.min_gpus

    def with_job_id(self, job_id: str) -> SubmitSpec:
        return replace(self, job_id=job_id)

    def to_json(self) -> str:
        """One line of JSON (no newline inside, so it also fits a script comment)."""
        d = _fields(self)
        d["command"] = list(self.command)
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> SubmitSpec:
        """Parse the file format; raises ValueError on anything malformed."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if d.get("version") != SPEC_VERSION:
            raise ValueError(f"unsupported spec version {d.get('version')!r}")
        try:
            total = d.get("total_samples")
            return SubmitSpec(
                job_id=str(d["job_id"]),
                user=str(d["user"]),
                min_gpus=_int(d["min_gpus"]),
                max_gpus=_int(d["max_gpus"]),
                model=str(d.get("model", "")),
                total_samples=None if total is None else _int(total),
                name=str(d.get("name", "")),
                partition=str(d.get("partition", "")),
                signal=str(d.get("signal", "USR2")),
                submitted=float(d.get("submitted", 0.0)),
                command=tuple(str(c) for c in d.get("command", ())),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"missing or bad field: {exc}") from None

    def to_job_spec(self, submit_time: float | None = None) -> JobSpec:
        """The policies' view of this job (work units = samples)."""
        return JobSpec(
            job_id=self.job_id,
            user=self.user,
            min_gpus=self.min_gpus,
            max_gpus=self.max_gpus,
            submit_time=self.submitted if submit_time is None else submit_time,
            total_work=None if self.total_samples is None else float(self.total_samples),
            name=self.name,
            model=self.model,
        )


def _fields(spec: SubmitSpec) -> dict[str, object]:
    return asdict(spec)


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def spec_dir(jobs_root: str | os.PathLike[str]) -> Path:
    return Path(jobs_root) / SPEC_DIR


def spec_file(directory: str | os.PathLike[str], job_id: str) -> Path:
    """`<directory>/<job id>.json`; ValueError for a job id that is not Slurm's (digits, ARRAY_TASK)."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"bad job id {job_id!r}")
    return Path(directory) / f"{job_id}.json"


def spec_path(jobs_root: str | os.PathLike[str], job_id: str) -> Path:
    """The old shared layout's spec file, `<jobs root>/spec/<job id>.json`."""
    return spec_file(spec_dir(jobs_root), job_id)


def ensure_spec_dir(jobs_root: str | os.PathLike[str]) -> Path:
    """Create <jobs root>/spec as a sticky world-writable directory if it is missing."""
    d = spec_dir(jobs_root)
    if not d.is_dir():
        try:
            d.mkdir(mode=0o1777)
        except FileExistsError:
            pass
        else:
            # mkdir's mode is cut by the umask; sticky + world-writable like /tmp is the point here.
            with contextlib.suppress(PermissionError):
                os.chmod(d, 0o1777)  # noqa: S103
    return d


def write_spec(jobs_root: str | os.PathLike[str], spec: SubmitSpec) -> Path:
    """Write the spec file atomically and durably (readable by all, owned by the caller)."""
    ensure_spec_dir(jobs_root)
    final = spec_path(jobs_root, spec.job_id)
    write_atomic(final, spec.to_json() + "\n", mode=SPEC_MODE, durable=True)
    return final


def write_specs(jobs_root: str | os.PathLike[str], specs: Iterable[SubmitSpec]) -> None:
    """Write many spec files (a job array's tasks) as `write_spec` does, but with one fsync of the spec
    directory instead of two per file: 10,000 of them take about a second, not minutes. A crash before the
    directory's fsync may lose specs of a job that is still held (the controller then waits for them)."""
    write_specs_in(ensure_spec_dir(jobs_root), specs)


def write_specs_in(directory: str | os.PathLike[str], specs: Iterable[SubmitSpec], *, durable: bool = False) -> None:
    """Write spec files `<directory>/<job id>.json` (a submission's private directory), then one fsync of
    the directory; `durable` fsyncs each file too (a single job's spec)."""
    for spec in specs:
        write_atomic(spec_file(directory, spec.job_id), spec.to_json() + "\n", mode=SPEC_MODE, durable=durable)
    if not durable:  # each durable write fsynced the directory already
        fsync_dir(directory)


def load_spec(jobs_root: str | os.PathLike[str], job_id: str, owner: str | None = None) -> SubmitSpec | None:
    """The spec of `job_id`, or None while there is none; JobFileError (one line) when the file is
    refused (a link, a FIFO, too big, not JSON, malformed) or, when `owner` is given, owned by neither
    `owner` nor root, or names another user or job. Read as untrusted input (see requeue.safe_read)."""
    try:
        path = spec_path(jobs_root, job_id)
    except ValueError as exc:
        raise JobFileError(f"{exc}: a spec is named after its Slurm job id") from None
    return load_spec_file(path, job_id, owner)


def load_spec_file(path: str | os.PathLike[str], job_id: str, owner: str | None = None) -> SubmitSpec | None:
    """`load_spec` of the spec file at `path` (the job's private directory's, see requeue.namespace)."""
    path = Path(path)
    text = read_job_text(path, owner=owner)
    if text is None:
        return None
    try:
        spec = SubmitSpec.from_json(text)
    except ValueError as exc:
        raise JobFileError(f"{path} is not a job spec ({exc}): refused; resubmit the job") from None
    if spec.job_id != job_id:
        raise JobFileError(f"{path} is the spec of job {spec.job_id!r}, not of job {job_id}: refused")
    if owner is not None and spec.user != owner:
        raise JobFileError(f"{path} names user {spec.user!r}, not the job's user {owner}: refused")
    return spec


def read_spec(jobs_root: str | os.PathLike[str], job_id: str, owner: str | None = None) -> SubmitSpec | None:
    """`load_spec`, with None for a refused file too."""
    try:
        return load_spec(jobs_root, job_id, owner)
    except JobFileError:
        return None


def spec_from_script(script: str) -> SubmitSpec | None:
    """The spec embedded in a batch script by `gandiva sbatch` (its job_id is "" there), or None."""
    for line in script.splitlines():
        if line.startswith(SCRIPT_MARKER):
            try:
                return SubmitSpec.from_json(line[len(SCRIPT_MARKER) :])
            except ValueError:
                return None
    return None


def fallback_spec(job_id: str, user: str, gpus: int, submitted: float = 0.0, name: str = "") -> SubmitSpec:
    """A rigid spec for a marked job submitted without `gandiva sbatch` (no spec file)."""
    n = max(1, gpus)
    return SubmitSpec(job_id=job_id, user=user, min_gpus=n, max_gpus=n, name=name, submitted=submitted)
