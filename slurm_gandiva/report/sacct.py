"""sacct-style slice reports: field selection, fixed-width / parsable2 / JSON output, sacct time syntax."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.store.api import SliceRecord

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


class Field(enum.Enum):
    """Columns of `gandiva sacct --format`; value = (header, default width)."""

    JOBID = ("JobID", 12)
    USER = ("User", 12)
    ACCOUNT = ("Account", 10)
    QOS = ("QOS", 8)
    SLICE = ("Slice", 5)
    NODELIST = ("NodeList", 15)
    GPUS = ("GPUs", 20)
    NGPUS = ("NGPUs", 5)
    SHARED = ("Shared", 6)
    START = ("Start", 19)
    END = ("End", 19)
    ELAPSED = ("Elapsed", 10)
    REASON = ("Reason", 9)

    @property
    def header(self) -> str:
        return self.value[0]

    @property
    def width(self) -> int:
        return self.value[1]


DEFAULT_FIELDS = (
    Field.JOBID,
    Field.USER,
    Field.SLICE,
    Field.NODELIST,
    Field.GPUS,
    Field.START,
    Field.END,
    Field.ELAPSED,
    Field.REASON,
)


# Where the slices' jobs ran under accounts (accounting on), the default format shows them after User.
DEFAULT_FIELDS_ACCOUNTS = (*DEFAULT_FIELDS[:2], Field.ACCOUNT, Field.QOS, *DEFAULT_FIELDS[2:])


@dataclass(frozen=True)
class Column:
    field: Field
    width: int


def parse_format(spec: str | None, accounts: bool = False) -> tuple[Column, ...]:
    """Parse sacct's --format: comma-separated, case-insensitive names, optional %WIDTH suffix. No `spec`:
    the default fields, with Account and QOS when `accounts` (some job has one: `has_accounts`)."""
    if not spec:
        return tuple(Column(f, f.width) for f in (DEFAULT_FIELDS_ACCOUNTS if accounts else DEFAULT_FIELDS))
    by_name = {f.header.lower(): f for f in Field}
    out = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, width = item.partition("%")
        field = by_name.get(name.lower())
        if field is None:
            known = ",".join(f.header for f in Field)
            raise BadRequest(f"unknown field {name!r} in --format: use some of {known}")
        if width and not width.isdigit():
            raise BadRequest(f"bad width {width!r} in --format field {item!r}: use NAME%NUMBER")
        out.append(Column(field, int(width) if width else field.width))
    if not out:
        raise BadRequest("--format names no fields: use e.g. --format=JobID,Start,End")
    return tuple(out)


def has_accounts(slices: Iterable[SliceRecord]) -> bool:
    """Whether any slice's job ran under a Slurm account or QOS."""
    return any(s.account or s.qos for s in slices)


_RELATIVE = re.compile(r"^now(?:([+-])(\d+)(seconds|minutes|hours|days|weeks|s|m|h|d|w)?)?$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_ABSOLUTE = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M")


def parse_time(text: str, now: float, tz: tzinfo | None = None) -> float:
    """Parse sacct's -S/-E syntax into unix seconds.

    Accepts YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS] (today), MM/DD[/YY], now and now[+-]N[units].
    Times without a zone are in `tz` (None: local time).
    """
    value = text.strip()
    m = _RELATIVE.match(value)
    if m:
        if not m.group(1):
            return now
        unit = _UNITS[(m.group(3) or "s")[0].lower()]
        delta = int(m.group(2)) * unit
        return now + delta if m.group(1) == "+" else now - delta
    for fmt in _ABSOLUTE:
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=tz).timestamp()
        except ValueError:
            continue
    today = datetime.fromtimestamp(now, tz)
    for fmt in ("%H:%M:%S", "%H:%M"):
        try:
            t = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return today.replace(hour=t.hour, minute=t.minute, second=t.second, microsecond=0).timestamp()
    for fmt in ("%m/%d/%y", "%m/%d"):
        try:
            t = datetime.strptime(value, fmt)
        except ValueError:
            continue
        year = t.year if fmt.endswith("%y") else today.year
        day = today.replace(year=year, month=t.month, day=t.day, hour=0, minute=0, second=0, microsecond=0)
        return day.timestamp()
    raise BadRequest(f"bad time {text!r}: use YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS], MM/DD[/YY] or now-N[hours]")


def format_time(t: float | None, tz: tzinfo | None = None) -> str:
    """sacct's time form; "Unknown" for a slice still running."""
    if t is None:
        return "Unknown"
    return datetime.fromtimestamp(t, tz).strftime(TIME_FORMAT)


def format_elapsed(seconds: float) -> str:
    """sacct's [D-]HH:MM:SS."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    hh, rem = divmod(rest, 3600)
    mm, ss = divmod(rem, 60)
    body = f"{hh:02d}:{mm:02d}:{ss:02d}"
    return f"{days}-{body}" if days else body


def _cell(field: Field, s: SliceRecord, now: float, tz: tzinfo | None) -> str:
    if field is Field.JOBID:
        return s.job_id
    if field is Field.USER:
        return s.user
    if field is Field.ACCOUNT:
        return s.account
    if field is Field.QOS:
        return s.qos
    if field is Field.SLICE:
        return str(s.seq)
    if field is Field.NODELIST:
        return ",".join(s.nodes)
    if field is Field.GPUS:
        return str(s.placement)
    if field is Field.NGPUS:
        return str(s.placement.count)
    if field is Field.SHARED:
        return "yes" if s.placement.shared else "no"
    if field is Field.START:
        return format_time(s.start, tz)
    if field is Field.END:
        return format_time(s.end, tz)
    if field is Field.ELAPSED:
        return format_elapsed(s.elapsed(now))
    return s.end_reason.value if s.end_reason else "running"


def rows(
    slices: Iterable[SliceRecord], columns: Sequence[Column], now: float, tz: tzinfo | None = None
) -> list[list[str]]:
    """The cells of each slice, as strings, in column order."""
    return [[_cell(c.field, s, now, tz) for c in columns] for s in slices]


def _fit(text: str, width: int) -> str:
    # sacct truncates a value that does not fit and marks it with '+'
    if len(text) > width:
        return text[: max(0, width - 1)] + "+"
    return text.rjust(width)


def render_table(
    slices: Iterable[SliceRecord],
    columns: Sequence[Column],
    now: float,
    *,
    header: bool = True,
    tz: tzinfo | None = None,
) -> str:
    """Fixed-width columns with a dashed rule under the header, as sacct prints by default."""
    lines = []
    if header:
        lines.append(" ".join(_fit(c.field.header, c.width) for c in columns))
        lines.append(" ".join("-" * c.width for c in columns))
    for row in rows(slices, columns, now, tz):
        lines.append(" ".join(_fit(v, c.width) for v, c in zip(row, columns, strict=True)))
    return "\n".join(lines) + ("\n" if lines else "")


def render_parsable2(
    slices: Iterable[SliceRecord],
    columns: Sequence[Column],
    now: float,
    *,
    header: bool = True,
    tz: tzinfo | None = None,
) -> str:
    """'|'-separated, no trailing delimiter, nothing truncated (sacct --parsable2)."""
    lines = ["|".join(c.field.header for c in columns)] if header else []
    lines.extend("|".join(row) for row in rows(slices, columns, now, tz))
    return "\n".join(lines) + ("\n" if lines else "")


def render_json(slices: Iterable[SliceRecord], now: float, tz: tzinfo | None = None) -> str:
    """All fields of every slice, with times both in sacct's form and as unix seconds."""
    out = []
    for s in slices:
        out.append(
            {
                "job_id": s.job_id,
                "user": s.user,
                "account": s.account,
                "qos": s.qos,
                "slice": s.seq,
                "nodes": list(s.nodes),
                "gpus": [str(g) for g in s.placement.gpus],
                "shared": s.placement.shared,
                "start": format_time(s.start, tz),
                "end": None if s.end is None else format_time(s.end, tz),
                "start_unix": s.start,
                "end_unix": s.end,
                "elapsed": round(s.elapsed(now), 3),
                "reason": s.end_reason.value if s.end_reason else None,
            }
        )
    return json.dumps({"slices": out}, indent=2) + "\n"
