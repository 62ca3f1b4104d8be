"""Trace loaders: our CSV/JSON format, the packaged Philly trace, malformed rows with line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gandiva.errors import TraceError
from slurm_gandiva.sim.trace import load_philly, load_trace, philly_path


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_csv_round_trip_sorted_with_defaults(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "t.csv",
        "job_id,submit_time,duration,gpus,model,max_gpus\nb,60,7200,4,imagenet,8\na,0,3600,1,,\n",
    )
    tr = load_trace(p)
    assert [j.job_id for j in tr.jobs] == ["a", "b"]
    a, b = tr.jobs
    assert (a.submit_time, a.duration, a.gpus, a.model, a.max_gpus) == (0.0, 3600.0, 1, None, None)
    assert (b.model, b.max_gpus, b.user) == ("imagenet", 8, "user")
    assert tr.span == 60.0
    assert tr.gpu_seconds() == 3600 + 4 * 7200


def test_csv_default_job_ids_and_blank_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "submit_time,duration,gpus\n0,10,1\n\n5,10,2\n")
    assert [j.job_id for j in load_trace(p).jobs] == ["j0", "j1"]


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ("x,10,1", "submit_time 'x' is not a number"),
        ("0,-5,1", "duration -5.0 must be > 0"),
        ("0,10,0", "gpus 0 must be >= 1"),
        ("0,10,1.5", "not a whole number"),
        ("0,10", "2 fields, the header has 3"),
        ("-1,10,1", "negative"),
        ("0,,1", "missing duration"),
        ("0,nan,1", "not finite"),
    ],
)
def test_csv_malformed_row_names_file_and_line(tmp_path: Path, row: str, what: str) -> None:
    p = write(tmp_path, "bad.csv", f"submit_time,duration,gpus\n0,10,1\n{row}\n1,1,1\n")
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    assert f"{p}:3:" in str(exc.value)
    assert what in str(exc.value)


def test_csv_line_number_counts_quoted_newlines(tmp_path: Path) -> None:
    p = write(tmp_path, "q.csv", 'job_id,submit_time,duration,gpus\n"two\nlines",0,1,1\nz,0,bad,1\n')
    with pytest.raises(TraceError, match=r"q\.csv:4: duration 'bad'"):
        load_trace(p)


def test_csv_missing_columns_and_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="header lacks gpus"):
        load_trace(write(tmp_path, "h.csv", "submit_time,duration\n0,1\n"))
    with pytest.raises(TraceError, match=r"m\.csv:2: unknown model 'gpt'"):
        load_trace(write(tmp_path, "m.csv", "submit_time,duration,gpus,model\n0,1,1,gpt\n"))
    with pytest.raises(TraceError, match="appears twice"):
        load_trace(write(tmp_path, "d.csv", "job_id,submit_time,duration,gpus\na,0,1,1\na,1,1,1\n"))


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "nope.csv")


def test_json_list_and_object_forms(tmp_path: Path) -> None:
    jobs = [{"job_id": "a", "submit_time": 0, "duration": 5, "gpus": 2, "model": "bert"}]
    p1 = write(tmp_path, "l.json", json.dumps(jobs))
    p2 = write(tmp_path, "o.json", json.dumps({"jobs": jobs}))
    assert load_trace(p1).jobs == load_trace(p2).jobs
    assert load_trace(p1).jobs[0].gpus == 2


def test_json_malformed_row_names_its_line(tmp_path: Path) -> None:
    text = (
        '{"jobs": [\n  {"submit_time": 0, "duration": 5, "gpus": 1},\n'
        '  {"submit_time": 1,\n   "duration": "x", "gpus": 1}\n]}\n'
    )
    p = write(tmp_path, "bad.json", text)
    with pytest.raises(TraceError, match=r"bad\.json:3: duration 'x' is not a number"):
        load_trace(p)
    p = write(tmp_path, "syntax.json", '[\n{"submit_time": 0,,}\n]')
    with pytest.raises(TraceError, match=r"syntax\.json:2: not valid JSON"):
        load_trace(p)


def test_philly_vc_first_n_and_load_factor() -> None:
    base = load_philly(vc="2869ce", jobs=50)
    assert len(base) == 50
    assert base.jobs[0].submit_time == 0.0
    times = [j.submit_time for j in base.jobs]
    assert times == sorted(times)
    fast = load_philly(vc="2869ce", jobs=50, load=2.0)
    assert [j.submit_time for j in fast.jobs] == pytest.approx([t / 2 for t in times])
    assert [j.duration for j in fast.jobs] == [j.duration for j in base.jobs]
    # 2869ce has 422 jobs in all; 8-GPU jobs dominate
    assert len(load_philly(vc="2869ce")) == 422
    assert philly_path().is_file()


def test_philly_matches_raw_rows() -> None:
    """The first 2869ce job by time is the raw CSV's earliest 2869ce row."""
    import csv

    with philly_path().open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["cluster"] == "2869ce"]
    first = min(rows, key=lambda r: r["timestamp"])
    job = load_philly(vc="2869ce", jobs=1).jobs[0]
    assert job.duration == float(first["duration"])
    assert job.gpus == int(first["num_gpus"])


def test_philly_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no jobs for virtual cluster 'zzz'"):
        load_philly(vc="zzz")
    p = write(
        tmp_path,
        "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,aa\n"
        "2017-10-09 07:02:55,66.0,one,66.0,aa\n",
    )
    with pytest.raises(TraceError, match=r"philly\.csv:3: gpus 'one' is not a number"):
        load_philly(p, vc="aa")
    p = write(tmp_path, "p2.csv", "timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,1,1,1,aa\n")
    with pytest.raises(TraceError, match=r"p2\.csv:2: timestamp 'yesterday'"):
        load_philly(p, vc="aa")
    with pytest.raises(TraceError, match="load factor"):
        load_philly(vc="2869ce", load=0)
