"""Trace checks that used to let bad input through silently, and the load/cap transforms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from slurm_gandiva.errors import TraceError
from slurm_gandiva.sim.trace import COLUMNS, Trace, TraceJob, load_philly, load_trace


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_csv_column_names_column_file_and_known_ones(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "submit_time,duration,gpus,max_gpu\n0,10,8,64\n")
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    assert str(exc.value) == f"{p}:1: unknown column 'max_gpu'; known columns: {', '.join(COLUMNS)}"


def test_unknown_json_key_names_its_line(tmp_path: Path) -> None:
    rows = [{"submit_time": 0, "duration": 1, "gpus": 1}, {"submit_time": 0, "duration": 1, "gpus": 8, "maxgpus": 2}]
    p = write(tmp_path, "t.json", json.dumps({"jobs": rows}, indent=1))
    with pytest.raises(TraceError, match=r"t\.json:8: unknown key 'maxgpus'; known keys: job_id"):
        load_trace(p)


@pytest.mark.parametrize(("max_gpus", "ok"), [("8", True), ("16", True), ("2", False), ("0", False), ("-1", False)])
def test_max_gpus_below_gpus_is_refused(tmp_path: Path, max_gpus: str, ok: bool) -> None:
    p = write(tmp_path, "t.csv", f"submit_time,duration,gpus,max_gpus\n0,10,1,\n0,10,8,{max_gpus}\n")
    if ok:
        assert load_trace(p).jobs[1].max_gpus == int(max_gpus)
    else:
        with pytest.raises(TraceError, match=rf"t\.csv:3: max_gpus {max_gpus} is below gpus 8; raise it"):
            load_trace(p)


def test_duplicate_header_column_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"t\.csv:1: column 'gpus' appears twice"):
        load_trace(write(tmp_path, "t.csv", "submit_time,duration,gpus,gpus\n0,1,1,8\n"))


def test_out_of_order_submit_times_are_sorted_stably(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "job_id,submit_time,duration,gpus\nc,20,1,1\na,0,1,1\nb,20,1,1\n")
    assert [j.job_id for j in load_trace(p).jobs] == ["a", "c", "b"]


def _trace(*jobs: tuple[float, int, int | None]) -> Trace:
    return Trace("t", tuple(TraceJob(f"j{i}", s, 100.0, g, max_gpus=m) for i, (s, g, m) in enumerate(jobs)))


def test_compressed_divides_gaps_from_the_first_arrival() -> None:
    tr = _trace((100, 1, None), (300, 1, None), (1100, 2, None))
    out = tr.compressed(2.0)
    assert [j.submit_time for j in out.jobs] == [100.0, 200.0, 600.0]
    assert out.offered_load(4) == pytest.approx(2 * tr.offered_load(4))
    assert tr.compressed(1.0) is tr
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(TraceError, match="must be a number > 0"):
            tr.compressed(bad)
    with pytest.raises(TraceError, match="must be a number > 0"):
        load_philly(vc="2869ce", jobs=5, load=-1.0)


def test_capped_and_oversized() -> None:
    tr = _trace((0, 1, 128), (10, 64, None), (20, 128, 256))
    assert [j.job_id for j in tr.oversized(32)] == ["j1", "j2"]
    capped = tr.capped(32)
    assert [(j.gpus, j.max_gpus) for j in capped.jobs] == [(1, 32), (32, None), (32, 32)]
    assert capped.gpu_seconds() == 100 * (1 + 32 + 32)
    assert not capped.oversized(32)
