"""Trace loaders: the packaged Philly trace and a small CSV/JSON format of our own.

Our own format (CSV with a header, or JSON), one job per row:

- ``submit_time`` (required): seconds since the trace start, >= 0.
- ``duration`` (required): seconds the job runs on ``gpus`` GPUs at the best placement, > 0.
- ``gpus`` (required): GPUs the job asks for, >= 1 (rigid policies run it on exactly that many).
- ``job_id`` (optional): unique name; default ``j<row number>`` (from 0).
- ``model`` (optional): one of bert, cifar10, deepspeech2, imagenet, ncf, yolov3; default: drawn
  from the seed.
- ``user`` (optional): default ``user``.
- ``account`` (optional): the user's Slurm account (a tenant of the fair-share layer, `--fairness
  shares`); default empty (one account for every user that gives none).
- ``max_gpus`` (optional): for elastic policies, the most GPUs the job may grow to, >= ``gpus``; default:
  where its model stops speeding up.
- ``group`` (optional): a name; jobs with the same one belong to one search (a Slurm job array, whose
  id becomes each job's `JobSpec.group`). Empty: no group.
- ``group_max`` (optional): int >= 1, the most jobs of the row's group that may run at once (the array's
  ``%MAX`` throttle: `ClusterView.group_caps`); needs ``group``, and every row of a group must give the
  same value (or all leave it empty: the group is not capped).

Any other column (JSON: key) is refused, naming it: a misspelt optional column would otherwise be dropped
without a word (``max_gpu`` leaving a job free to grow to the whole cluster).

CSV example::

    job_id,submit_time,duration,gpus,model
    a,0,3600,1,cifar10
    b,60,7200,4,imagenet

JSON: either a list of such objects, or ``{"jobs": [...]}``. A malformed row raises TraceError naming
the file and the line (CSV: the physical line; JSON: the line the row's object starts on).

Philly (``philly.csv``): rows of one virtual cluster sorted by submission time (ties keep file order),
the first N taken, times made relative to the first and divided by the load factor (load 2.0 = arrivals
twice as dense). `Trace.compressed` does the same to any trace. Philly rows have no groups.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from slurm_gandiva.errors import TraceError
from slurm_gandiva.profiles import MODEL_NAMES, data_dir

PHILLY = "philly"
COLUMNS = ("job_id", "submit_time", "duration", "gpus", "model", "user", "account", "max_gpus", "group", "group_max")


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace. `group_max` is its group's throttle (the same on every job of the group)."""

    job_id: str
    submit_time: float
    duration: float
    gpus: int
    model: str | None = None
    user: str = "user"
    account: str = ""
    max_gpus: int | None = None
    group: str | None = None
    group_max: int | None = None


@dataclass(frozen=True)
class Trace:
    """Jobs sorted by submission time (stable)."""

    name: str
    jobs: tuple[TraceJob, ...]

    def __post_init__(self) -> None:
        caps: dict[str, int | None] = {}
        for j in self.jobs:
            if j.group is None:
                if j.group_max is not None:
                    raise TraceError(f"trace {self.name}: job {j.job_id} has group_max but no group")
                continue
            if j.group_max is not None and j.group_max < 1:
                raise TraceError(f"trace {self.name}: job {j.job_id}: group_max {j.group_max} must be >= 1")
            if caps.setdefault(j.group, j.group_max) != j.group_max:
                raise TraceError(
                    f"trace {self.name}: job {j.job_id} of group {j.group!r} has {_cap_text(j.group_max)}, "
                    f"an earlier job of it {_cap_text(caps[j.group])}; a group has one throttle"
                )

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Group -> the ids of its jobs, in trace order (ungrouped jobs are left out)."""
        out: dict[str, list[str]] = {}
        for j in self.jobs:
            if j.group is not None:
                out.setdefault(j.group, []).append(j.job_id)
        return {g: tuple(ids) for g, ids in out.items()}

    @property
    def group_caps(self) -> dict[str, int]:
        """Group -> the most of its jobs that may run at once (`ClusterView.group_caps`); uncapped groups
        are left out. A new dict on each call."""
        return {j.group: j.group_max for j in self.jobs if j.group is not None and j.group_max is not None}

    @property
    def span(self) -> float:
        return self.jobs[-1].submit_time - self.jobs[0].submit_time if self.jobs else 0.0

    def gpu_seconds(self) -> float:
        return sum(j.duration * j.gpus for j in self.jobs)

    def offered_load(self, gpus: int) -> float:
        """GPU time asked for over GPU time available between the first and the last arrival."""
        return self.gpu_seconds() / (gpus * self.span) if self.span > 0 else math.inf

    def compressed(self, load: float) -> Trace:
        """Arrivals made `load` times as dense (the gaps from the first arrival divided by `load`)."""
        check_load(load)
        if load == 1.0 or not self.jobs:
            return self
        t0 = self.jobs[0].submit_time
        return Trace(self.name, tuple(replace(j, submit_time=t0 + (j.submit_time - t0) / load) for j in self.jobs))

    def oversized(self, gpus: int) -> tuple[TraceJob, ...]:
        """The jobs that ask for more than `gpus` GPUs."""
        return tuple(j for j in self.jobs if j.gpus > gpus)

    def capped(self, gpus: int) -> Trace:
        """Each job's GPU count (and GPU range) capped at `gpus`."""
        return Trace(
            self.name,
            tuple(
                replace(j, gpus=min(j.gpus, gpus), max_gpus=None if j.max_gpus is None else min(j.max_gpus, gpus))
                for j in self.jobs
            ),
        )


def check_load(load: float) -> None:
    """TraceError unless `load` is a usable arrival compression factor."""
    if not (math.isfinite(load) and load > 0):
        raise TraceError(f"load factor {load} must be a number > 0 (2.0 = arrivals twice as dense)")


def philly_path() -> Path:
    return data_dir() / "philly" / "philly.csv"


def _num(value: str | None, what: str, where: str) -> float:
    if value is None or str(value).strip() == "":
        raise TraceError(f"{where}: missing {what}; fix the row or drop it")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {what} {value!r} is not a number; fix the row") from None
    if not math.isfinite(out):
        raise TraceError(f"{where}: {what} {value!r} is not finite; fix the row")
    return out


def _int(value: str | None, what: str, where: str) -> int:
    out = _num(value, what, where)
    if out != int(out):
        raise TraceError(f"{where}: {what} {value!r} is not a whole number; fix the row")
    return int(out)


def _job_from_row(row: Mapping[str, object], index: int, where: str) -> TraceJob:
    def get(key: str) -> str | None:
        v = row.get(key)
        return None if v is None else str(v)

    submit = _num(get("submit_time"), "submit_time", where)
    duration = _num(get("duration"), "duration", where)
    gpus = _int(get("gpus"), "gpus", where)
    if submit < 0:
        raise TraceError(f"{where}: submit_time {submit} is negative; times are seconds from the trace start")
    if duration <= 0:
        raise TraceError(f"{where}: duration {duration} must be > 0")
    if gpus < 1:
        raise TraceError(f"{where}: gpus {gpus} must be >= 1")
    model = get("model") or None
    if model is not None and model not in MODEL_NAMES:
        raise TraceError(f"{where}: unknown model {model!r}; use one of {', '.join(MODEL_NAMES)} or leave it empty")
    max_raw = get("max_gpus")
    max_gpus = _int(max_raw, "max_gpus", where) if max_raw not in (None, "") else None
    if max_gpus is not None and max_gpus < gpus:
        raise TraceError(f"{where}: max_gpus {max_gpus} is below gpus {gpus}; raise it or leave it empty")
    raw_group = row.get("group")
    if raw_group is not None and (isinstance(raw_group, bool) or not isinstance(raw_group, (str, int))):
        raise TraceError(f"{where}: group {raw_group!r} is not a name; give a string or leave it out")
    group = (str(raw_group).strip() or None) if raw_group is not None else None
    account = _name(row.get("account"), "account", where)
    cap_raw = get("group_max")
    group_max = _int(cap_raw, "group_max", where) if cap_raw not in (None, "") else None
    if group_max is not None:
        if group is None:
            raise TraceError(f"{where}: group_max {group_max} without a group; name the group or drop it")
        if group_max < 1:
            raise TraceError(f"{where}: group_max {group_max} must be >= 1 (jobs of the group that may run at once)")
    return TraceJob(
        job_id=get("job_id") or f"j{index}",
        submit_time=submit,
        duration=duration,
        gpus=gpus,
        model=model,
        user=get("user") or "user",
        account=account,
        max_gpus=max_gpus,
        group=group,
        group_max=group_max,
    )


def _name(raw: object, what: str, where: str) -> str:
    """A name column's value ("" when empty or left out); TraceError for a value that is not a name."""
    if raw is None:
        return ""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise TraceError(f"{where}: {what} {raw!r} is not a name; give a string or leave it out")
    text = str(raw).strip()
    if any(c.isspace() or c in ",=" for c in text):
        raise TraceError(f"{where}: {what} {text!r} has a space, comma or '='; use a plain name")
    return text


def _check_group(job: TraceJob, seen: dict[str, tuple[int | None, str]], where: str) -> None:
    """TraceError unless `job`'s group_max agrees with the first row of its group (`seen`: group ->
    (its group_max, that row's file:line), filled in here)."""
    if job.group is None:
        return
    first = seen.setdefault(job.group, (job.group_max, where))
    if first[0] != job.group_max:
        raise TraceError(
            f"{where}: {_cap_text(job.group_max)} for group {job.group!r}, but {first[1]} gave it "
            f"{_cap_text(first[0])}; rows of one group must agree"
        )


def _cap_text(cap: int | None) -> str:
    return "no group_max" if cap is None else f"group_max {cap}"


def _check_keys(row: Mapping[str, object], where: str, what: str) -> None:
    unknown = [k for k in row if k not in COLUMNS]
    if unknown:
        raise TraceError(f"{where}: unknown {what} {unknown[0]!r}; known {what}s: {', '.join(COLUMNS)}")


def _finish(name: str, jobs: Iterable[TraceJob], path: Path) -> Trace:
    out = sorted(jobs, key=lambda j: j.submit_time)
    seen: set[str] = set()
    for j in out:
        if j.job_id in seen:
            raise TraceError(f"{path}: job_id {j.job_id!r} appears twice; job ids must be unique")
        seen.add(j.job_id)
    return Trace(name, tuple(out))


def _csv_rows(path: Path, keep: tuple[str, str] | None = None) -> Iterator[tuple[int, dict[str, str]]]:
    """(physical line number, row) for each data row; with `keep=(column, value)`, only the rows
    whose column has that value (tested before the row is parsed further: the Philly file is big)."""
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}; check the path") from exc
    with fh, _as_text(path):
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise TraceError(f"{path}:1: empty file; a trace needs a header row")
        header = [h.strip() for h in header]
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise TraceError(f"{path}:1: column {twice[0]!r} appears twice in the header; keep one")
        col = -1
        if keep is not None:
            if keep[0] not in header:
                raise TraceError(f"{path}:1: no {keep[0]!r} column; is this the Philly trace?")
            col = header.index(keep[0])
        line = reader.line_num
        for cells in reader:
            start, line = line + 1, reader.line_num
            if keep is not None and (len(cells) <= col or cells[col].strip() != keep[1]):
                continue
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise TraceError(f"{path}:{start}: {len(cells)} fields, the header has {len(header)}; fix the row")
            yield start, dict(zip(header, (c.strip() for c in cells), strict=True))


@contextlib.contextmanager
def _as_text(path: Path) -> Iterator[None]:
    """TraceError (one line) for a file that is not UTF-8 text (e.g. a binary file named .csv)."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x}); a trace is a CSV or JSON text file"
        ) from None


def load_trace(path: str | Path) -> Trace:
    """Read a trace in our own CSV or JSON format (see the module docstring)."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        return _load_json(p)
    jobs = []
    seen: dict[str, tuple[int | None, str]] = {}
    for i, (line, row) in enumerate(_csv_rows(p)):
        if i == 0:
            missing = {"submit_time", "duration", "gpus"} - set(row)
            if missing:
                raise TraceError(f"{p}:1: header lacks {', '.join(sorted(missing))}; see `gandiva simulate --help`")
            _check_keys(row, f"{p}:1", "column")
        job = _job_from_row(row, i, f"{p}:{line}")
        _check_group(job, seen, f"{p}:{line}")
        jobs.append(job)
    return _finish(p.stem, jobs, p)


def _load_json(p: Path) -> Trace:
    try:
        with _as_text(p):
            text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror}; check the path") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg}); fix the file") from None
    rows = data.get("jobs") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise TraceError(f'{p}:1: expected a list of jobs or {{"jobs": [...]}}')
    starts = _object_lines(text)
    jobs = []
    seen: dict[str, tuple[int | None, str]] = {}
    for i, row in enumerate(rows):
        line = starts[i] if i < len(starts) else 1
        if not isinstance(row, dict):
            raise TraceError(f"{p}:{line}: job {i} is not an object")
        _check_keys(row, f"{p}:{line}", "key")
        job = _job_from_row(row, i, f"{p}:{line}")
        _check_group(job, seen, f"{p}:{line}")
        jobs.append(job)
    return _finish(p.stem, jobs, p)


def _object_lines(text: str) -> list[int]:
    """Line numbers where each job object starts (the objects one level inside the jobs list)."""
    out: list[int] = []
    depth, line, in_str, esc = 0, 1, False, False
    list_depth: int | None = None
    for ch in text:
        if ch == "\n":
            line += 1
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "[{":
            if ch == "[" and list_depth is None:
                list_depth = depth + 1
            elif ch == "{" and list_depth is not None and depth == list_depth:
                out.append(line)
            depth += 1
        elif ch in "]}":
            depth -= 1
    return out


def load_philly(
    path: str | Path | None = None,
    *,
    vc: str | None = None,
    jobs: int | None = None,
    load: float = 1.0,
) -> Trace:
    """Jobs of one Philly virtual cluster (all clusters when `vc` is None), first `jobs` by submission."""
    check_load(load)
    p = Path(path) if path is not None else philly_path()
    rows: list[tuple[datetime, int, dict[str, str]]] = []
    for line, row in _csv_rows(p, ("cluster", vc) if vc is not None else None):
        where = f"{p}:{line}"
        try:
            ts = datetime.fromisoformat(row["timestamp"])
        except (KeyError, ValueError):
            raise TraceError(f"{where}: timestamp {row.get('timestamp')!r} is not YYYY-MM-DD HH:MM:SS") from None
        rows.append((ts, line, row))
    if not rows:
        raise TraceError(f"{p}: no jobs for virtual cluster {vc!r}; pick one listed in its `cluster` column")
    rows.sort(key=lambda r: (r[0], r[1]))
    if jobs is not None:
        rows = rows[:jobs]
    t0 = rows[0][0]
    out = []
    for i, (ts, line, row) in enumerate(rows):
        where = f"{p}:{line}"
        rel = (ts - t0).total_seconds() / load
        out.append(
            _job_from_row(
                {"submit_time": rel, "duration": row.get("duration"), "gpus": row.get("num_gpus")},
                i,
                where,
            )
        )
    name = f"philly-{vc or 'all'}"
    return Trace(name, tuple(out))
