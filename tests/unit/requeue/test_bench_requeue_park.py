"""bench_requeue.py's in-place part (issue 31): its pure helpers, on hand-made figures (no Slurm)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # bench_requeue imports bench_requeue_park by this name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def park() -> ModuleType:
    return _load("bench_requeue_park")


@pytest.fixture(scope="module")
def bench(park: ModuleType) -> ModuleType:
    return _load("bench_requeue")


# /proc/PID/stat of a process whose name holds a space and a ')': utime 250, stime 50 ticks; parent 4321.
STAT = "1234 (py thon) x) S 4321 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 777 0 0\n"


def test_cpu_seconds_counts_fields_after_the_last_parenthesis(park: ModuleType) -> None:
    assert park.cpu_seconds(STAT, 100) == pytest.approx(3.0)
    assert park.parent_pid(STAT) == 4321


def _sizes() -> dict[str, Any]:
    return {
        "small": {
            "suspend": {"signal_to_gpus_free_s": 0.4},
            "move": {"resume_to_training_s": 3.6},
            "inplace": {
                "park_s": 0.1,
                "unpark_s": 0.15,
                "switch_s": 0.25,
                "parked_cpu_s": 0.0,
                "wrapper_cpu_s": 0.01,
                "parked_bytes": 2.0e7,
                "park_call_s": 0.12,
                "unpark_running_s": 0.05,
            },
        },
        "large": {
            "suspend": {"signal_to_gpus_free_s": 0.6},
            "move": {"resume_to_training_s": 3.4},
            "inplace": {"park_s": 0.3, "unpark_s": 0.5, "switch_s": 0.8, "parked_cpu_s": 0.02},
        },
        "medium": {"suspend": {"signal_to_gpus_free_s": 0.5}, "move": {}},  # nothing in place, no resume
    }


def test_table_sets_the_in_place_switch_beside_the_requeue_switch_with_the_acceptance(park: ModuleType) -> None:
    lines = park.table(_sizes(), 3)
    assert "medians of 6 switches" in lines[0]
    small = next(ln for ln in lines if ln.startswith("small "))
    # requeue switch 0.4 + 3.6 = 4.0 s against 0.25 s in place: 16x
    assert "4.000 s" in small and "0.250 s" in small and "16.0x" in small and "20.00 MB" in small
    medium = next(ln for ln in lines if ln.startswith("medium "))
    assert "0.500 s" in medium and medium.count(" - ") >= 3  # no resume, no in-place figures: dashes, no ratio
    acc = lines[lines.index("\nacceptance (issue 31):") + 1 :]
    assert "0.250 s <= 0.5 s: PASS" in acc[0] and acc[0].lstrip().startswith("small")
    assert "0.800 s <= 0.5 s: FAIL" in acc[1] and "CPU 0.020 s in 2 s" in acc[1]
    assert acc[2].lstrip().startswith("medium") and ": -;" in acc[2]


def test_requeue_switch_is_suspend_plus_resume_or_none(park: ModuleType) -> None:
    assert park.requeue_switch_s({"signal_to_gpus_free_s": 0.5}, {"resume_to_training_s": 4.0}) == 4.5
    assert park.requeue_switch_s({"signal_to_gpus_free_s": 0.5}, {}) is None


def test_medians_skip_keys_without_samples(park: ModuleType) -> None:
    assert park.medians({"a": [3.0, 1.0, 2.0], "b": []}) == {"a": 2.0}


def test_merged_results_carry_park_and_unpark_into_the_overheads(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "requeue.json"
    old = {"sizes": {"small": {"suspend": {"signal_to_gpus_free_s": 0.3}, "move": {"resume_to_training_s": 3.0}}}}
    out.write_text(json.dumps({"releases": {"22.05": {"slurm": "22.05.8", "packing": False, **old}}}))
    got = bench.merged_results(out, "24.11.5", {"packing": True, "sizes": _sizes()})
    assert set(got["releases"]) == {"22.05", "24.11"}  # the other release's entry kept
    assert got["releases"]["24.11"]["sizes"]["small"]["inplace"]["switch_s"] == 0.25
    ov = got["overheads"]
    assert ov["from"] == "Slurm 24.11" and ov["suspend_s"] == 0.4 and ov["migrate_s"] == pytest.approx(4.0)
    assert (ov["park_s"], ov["unpark_s"]) == (0.1, 0.15)  # the first size's, as suspend_s and resume_s


def test_merged_results_without_in_place_figures_leave_park_out(bench: ModuleType, tmp_path: Path) -> None:
    sizes = {"small": {"suspend": {"signal_to_gpus_free_s": 0.3}, "move": {"resume_to_training_s": 3.0}}}
    got = bench.merged_results(tmp_path / "none.json", "22.05.8", {"packing": False, "sizes": sizes})
    assert got["overheads"]["from"] == "Slurm 22.05"
    assert "park_s" not in got["overheads"] and "unpark_s" not in got["overheads"]
