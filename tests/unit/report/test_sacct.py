"""sacct-style rendering and time parsing (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from slurm_gandiva.errors import BadRequest
from slurm_gandiva.model import GpuRef, Placement
from slurm_gandiva.report.sacct import (
    DEFAULT_FIELDS,
    Field,
    format_elapsed,
    format_time,
    has_accounts,
    parse_format,
    parse_time,
    render_json,
    render_parsable2,
    render_table,
)
from slurm_gandiva.store import SliceEnd, SliceRecord

UTC = timezone.utc
T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC).timestamp()

SLICES = (
    SliceRecord(1, "101", "alice", 1, Placement((GpuRef("n1", 0), GpuRef("n1", 1))), T0, T0 + 60, SliceEnd.QUANTUM),
    SliceRecord(2, "102", "bob", 1, Placement((GpuRef("n2", 3),), shared=True), T0 + 5, None, None),
    SliceRecord(
        3,
        "101",
        "alice",
        2,
        Placement((GpuRef("n1", 2), GpuRef("n2", 0))),
        T0 + 120,
        T0 + 120 + 90061,
        SliceEnd.MIGRATE,
    ),
)
NOW = T0 + 3600


def test_parse_format_default_and_custom() -> None:
    assert [c.field for c in parse_format(None)] == list(DEFAULT_FIELDS)
    cols = parse_format("jobid,GPUS%30, elapsed")
    assert [(c.field, c.width) for c in cols] == [(Field.JOBID, 12), (Field.GPUS, 30), (Field.ELAPSED, 10)]


@pytest.mark.parametrize(
    ("spec", "msg"), [("JobID,Bogus", "unknown field 'Bogus'"), ("JobID%x", "bad width"), (",", "no fields")]
)
def test_parse_format_errors_are_one_line(spec: str, msg: str) -> None:
    with pytest.raises(BadRequest, match=msg) as err:
        parse_format(spec)
    assert "\n" not in str(err.value)


def test_parse_time_forms() -> None:
    now = datetime(2026, 11, 22, 15, 30, 0, tzinfo=UTC).timestamp()
    assert parse_time("2026-11-22T10:00:00", now, UTC) == T0
    assert parse_time("2026-11-22T10:00", now, UTC) == T0
    assert parse_time("2026-11-22", now, UTC) == T0 - 10 * 3600
    assert parse_time("10:00", now, UTC) == T0
    assert parse_time("11/22", now, UTC) == T0 - 10 * 3600
    assert parse_time("now", now, UTC) == now
    assert parse_time("now-2hours", now, UTC) == now - 7200
    assert parse_time("now-30", now, UTC) == now - 30
    assert parse_time("now+1d", now, UTC) == now + 86400


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01", "25:00", "now-x", ""])
def test_parse_time_rejects_garbage(bad: str) -> None:
    with pytest.raises(BadRequest, match="bad time"):
        parse_time(bad, T0, UTC)


def test_time_and_elapsed_formats() -> None:
    assert format_time(T0, UTC) == "2026-11-22T10:00:00"
    assert format_time(None) == "Unknown"
    assert format_elapsed(59) == "00:00:59"
    assert format_elapsed(3 * 3600 + 61) == "03:01:01"
    assert format_elapsed(90061) == "1-01:01:01"


def test_table_is_fixed_width_like_sacct() -> None:
    out = render_table(SLICES, parse_format(None), NOW, tz=UTC).splitlines()
    widths = [c.width for c in parse_format(None)]
    assert len(out) == 2 + len(SLICES)
    assert out[1] == " ".join("-" * w for w in widths)
    assert all(len(line) == len(out[1]) for line in out)
    assert out[0].split() == ["JobID", "User", "Slice", "NodeList", "GPUs", "Start", "End", "Elapsed", "Reason"]
    assert out[2].split() == [
        "101",
        "alice",
        "1",
        "n1",
        "n1:0+1",
        "2026-11-22T10:00:00",
        "2026-11-22T10:01:00",
        "00:01:00",
        "quantum",
    ]
    running = out[3].split()
    assert running[4] == "n2:3(shared)" and running[6] == "Unknown" and running[7] == "00:59:55"
    assert running[8] == "running"
    assert out[4].split()[7] == "1-01:01:01"


def test_table_truncates_with_plus() -> None:
    out = render_table(SLICES[2:], parse_format("NodeList%4,GPUs%6"), NOW, header=False, tz=UTC)
    assert out == "n1,+ n1:2,+\n"


def test_parsable2_has_no_trailing_bar_and_no_truncation() -> None:
    out = render_parsable2(SLICES, parse_format("JobID,NodeList%2,GPUs"), NOW, tz=UTC).splitlines()
    assert out == ["JobID|NodeList|GPUs", "101|n1|n1:0+1", "102|n2|n2:3(shared)", "101|n1,n2|n1:2,n2:0"]
    assert render_parsable2(SLICES[:1], parse_format("JobID"), NOW, header=False) == "101\n"


def test_json_has_every_field() -> None:
    doc = json.loads(render_json(SLICES, NOW, UTC))
    first, running = doc["slices"][0], doc["slices"][1]
    assert first == {
        "job_id": "101",
        "user": "alice",
        "account": "",
        "qos": "",
        "slice": 1,
        "nodes": ["n1"],
        "gpus": ["n1:0", "n1:1"],
        "shared": False,
        "start": "2026-11-22T10:00:00",
        "end": "2026-11-22T10:01:00",
        "start_unix": T0,
        "end_unix": T0 + 60,
        "elapsed": 60.0,
        "reason": "quantum",
    }
    assert running["end"] is None and running["reason"] is None and running["shared"] is True


def test_account_and_qos_columns() -> None:
    tenants = (
        SliceRecord(1, "201", "alice", 1, Placement((GpuRef("n1", 0),)), T0, T0 + 60, SliceEnd.DONE, "physics", "high"),
        SliceRecord(2, "202", "bob", 1, Placement((GpuRef("n1", 1),)), T0, None, None, "bio", ""),
    )
    assert not has_accounts(SLICES) and has_accounts(tenants)
    assert Field.ACCOUNT not in [c.field for c in parse_format(None)]  # accounting off: sacct's old default
    cols = parse_format(None, accounts=True)
    assert [c.field for c in cols][:4] == [Field.JOBID, Field.USER, Field.ACCOUNT, Field.QOS]
    lines = render_table(tenants, cols, NOW, tz=UTC).splitlines()
    assert lines[0].split()[:4] == ["JobID", "User", "Account", "QOS"]
    assert lines[2].split()[:4] == ["201", "alice", "physics", "high"]
    assert render_parsable2(tenants, parse_format("JobID,account,qos"), NOW, tz=UTC).splitlines() == [
        "JobID|Account|QOS",
        "201|physics|high",
        "202|bio|",
    ]
    doc = json.loads(render_json(tenants, NOW, UTC))
    assert [(x["account"], x["qos"]) for x in doc["slices"]] == [("physics", "high"), ("bio", "")]
