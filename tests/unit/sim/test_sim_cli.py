"""`gandiva simulate` end to end with the real policies (the same objects the controller uses)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.sim.cli import ProgressBar, make_named_policy, parse_params

TRACE = "job_id,submit_time,duration,gpus,model\na,0,100,1,cifar10\nb,10,50,1,cifar10\nc,20,30,2,imagenet\n"


def test_single_policy_summary_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = tmp_path / "t.csv"
    tr.write_text(TRACE)
    out = tmp_path / "out"
    costs = ["--start-cost", "0", "--suspend-cost", "0", "--resume-cost", "0", "--out", str(out)]
    argv = ["simulate", "--trace", str(tr), "--gpus", "1", "--gpus-per-node", "1", "--policy", "fifo", "--cap-gpus"]
    rc = main([*argv, *costs])
    captured = capsys.readouterr()
    assert rc == 0
    assert "warning: 1 job(s) ask for more than the cluster's 1 GPUs (the largest 2); capped at 1" in captured.err
    # offered load on what runs: (100 + 50 + 30 * 1) GPU-s over 20 s on 1 GPU
    assert "offered load 9.00 on 1 GPUs" in captured.err
    assert captured.out.splitlines()[0].startswith("policy")
    assert "fifo" in captured.out and "3/3" in captured.out
    assert "3/3 jobs" in captured.err  # the progress bar
    summary = json.loads((out / "fifo.summary.json").read_text())
    # FIFO on one GPU: a 0-100, b 100-150, c (2 GPUs asked, clamped to 1) 150-180 -> JCTs 100, 140, 160
    assert summary["summary"]["avg_jct"] == pytest.approx((100 + 140 + 160) / 3)
    assert summary["elastic"] is False
    assert {p.name for p in out.iterdir()} >= {"fifo.jobs.csv", "fifo.timeline.csv", "fifo.timeline.png", "jct_cdf.png"}


def test_compare_prints_ratios_to_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = tmp_path / "t.json"
    tr.write_text(
        json.dumps([{"submit_time": i * 30, "duration": 600, "gpus": 1 + i % 2, "model": "bert"} for i in range(8)])
    )
    rc = main(["simulate", "--trace", str(tr), "--gpus", "4", "--compare", "fifo,afs-l,default", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()}
    assert {"fifo", "afs-l", "default"} <= set(rows)
    assert "x)" in rows["fifo"] and "x)" not in rows["default"]
    assert "ratios: each figure over default's" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "10"], "multiple of --gpus-per-node"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--vc", "zzz"], "no jobs for virtual cluster"),
        (["--param", "oops"], "KEY=VALUE"),
        (["--policy", "fifo", "--param", "bogus=1"], "no parameter bogus"),
    ],
)
def test_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--no-progress", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert "Traceback" not in err


def test_policy_factory_passes_seed_and_params() -> None:
    assert parse_params(["quantum=120", "backfill=true", "lease=none", "x=abc"]) == {
        "quantum": 120,
        "backfill": True,
        "lease": None,
        "x": "abc",
    }
    afs = make_named_policy("afs-p", seed=5)
    assert afs.seed == 5
    assert make_named_policy("fifo", seed=5, params={"backfill": True}).backfill is True


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_on_a_tty_and_logs_tenths_elsewhere() -> None:
    clock = iter([0.0, 0.05, 1.0, 2.0]).__next__
    tty = FakeTty()
    bar = ProgressBar("x", tty, interval=0.2, clock=clock)
    bar(0, 10, 0.0)
    bar(1, 10, 0.0)  # 0.05 s later: skipped
    bar(5, 10, 3600.0)
    bar(10, 10, 7200.0)
    out = tty.getvalue()
    assert out.count("\r") == 3 and "1/10" not in out and out.endswith("10/10 jobs, t=2.0 h simulated\n")
    log = io.StringIO()
    bar = ProgressBar("x", log)
    for i in range(101):
        bar(i, 100, 0.0)
    assert len(log.getvalue().splitlines()) == 11  # 0%, 10%, ..., 100%


def _bad(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


HEAD = "job_id,submit_time,duration,gpus"


@pytest.mark.parametrize(
    ("name", "text", "extra", "message"),
    [
        (
            "big.csv",
            f"{HEAD}\na,0,10,1\nb,5,10,8\nc,6,10,6\n",
            [],
            "2 job(s) ask for more than the cluster's 4 GPUs (the largest 8); raise --gpus, or pass --cap-gpus",
        ),
        ("t.csv", f"{HEAD}\na,0,10,1\n", ["--load", "-1"], "--load -1.0 must be a number > 0"),
        ("t.csv", f"{HEAD}\na,0,10,1\n", ["--load", "0"], "--load 0.0 must be a number > 0"),
        ("t.csv", f"{HEAD}\na,0,10,1\n", ["--load", "nan"], "--load nan must be a number > 0"),
        (
            "typo.csv",
            f"{HEAD},max_gpu\na,0,10,1,4\n",
            [],
            "typo.csv:1: unknown column 'max_gpu'; known columns: job_id,",
        ),
        (
            "typo.json",
            '[{"submit_time": 0, "duration": 1, "gpus": 1, "max_gpu": 4}]',
            [],
            "typo.json:1: unknown key 'max_gpu'",
        ),
        ("range.csv", f"{HEAD},max_gpus\na,0,10,1,1\nb,0,10,4,2\n", [], "range.csv:3: max_gpus 2 is below gpus 4"),
        ("min.csv", f"{HEAD},min_gpus\na,0,10,1,2\n", [], "unknown column 'min_gpus'"),
        ("zero.csv", f"{HEAD}\na,0,10,0\n", [], "zero.csv:2: gpus 0 must be >= 1"),
        ("neg.csv", f"{HEAD},max_gpus\na,0,10,1,-2\n", [], "neg.csv:2: max_gpus -2 is below gpus 1"),
        ("nan.csv", f"{HEAD}\na,0,nan,1\n", [], "nan.csv:2: duration 'nan' is not finite"),
        ("dup.csv", f"{HEAD}\na,0,10,1\na,5,10,1\n", [], "job_id 'a' appears twice"),
        ("twice.csv", "submit_time,duration,gpus,gpus\n0,10,1,8\n", [], "twice.csv:1: column 'gpus' appears twice"),
    ],
)
def test_bad_trace_input_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, extra: list[str], message: str
) -> None:
    tr = _bad(tmp_path, name, text)
    rc = main(["simulate", "--trace", tr, "--gpus", "4", "--policy", "fifo", "--no-progress", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("gandiva: error: "), err
    assert message in err


def test_load_compresses_a_file_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr = _bad(tmp_path, "t.csv", f"{HEAD}\na,100,3600,1\nb,3700,3600,1\n")
    spans = []
    for load in ("1", "2"):
        rc = main(["simulate", "--trace", tr, "--gpus", "4", "--policy", "fifo", "--no-progress", "--load", load])
        assert rc == 0
        err = capsys.readouterr().err
        spans.append(err.split("over ")[1].split(" h")[0])
    assert spans == ["1.0", "0.5"]  # 3600 s between arrivals, then 1800 s


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("quantum=0", "policy parameter quantum = 0 must be positive"),
        ("quantum=-5", "policy parameter quantum = -5 must be positive"),
        ("min_slice=abc", "policy parameter min_slice = 'abc' must be a number"),
    ],
)
def test_policy_parameters_are_checked_as_the_controller_checks_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], param: str, message: str
) -> None:
    """A bad --param ends the run at once in one line, as the controller's config check would: quantum=0
    used to hang the simulator at t=0 (on a 600-job trace here) and min_slice=abc to end in a TypeError."""
    tr = tmp_path / "t.csv"
    tr.write_text(HEAD + "\n" + "".join(f"j{i},{i},600,1\n" for i in range(600)))
    began = time.monotonic()
    rc = main(["simulate", "--trace", str(tr), "--gpus", "4", "--policy", "gandiva", "--no-progress", "--param", param])
    err = capsys.readouterr().err
    assert time.monotonic() - began < 10
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("gandiva: error: "), err
    assert message in err


def test_an_optional_parameter_may_be_left_unset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert make_named_policy("gandiva", params={"quantum": None, "min_slice": 30}).quantum is None
    rc = main(["simulate", "--trace", _bad(tmp_path, "t.csv", f"{HEAD}\na,0,10,1\n"), "--gpus", "4", "--policy",
               "gandiva", "--no-progress", "--param", "quantum=none"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", ["bin.csv", "bin.json"])
def test_a_trace_that_is_not_utf8_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    tr = tmp_path / name
    tr.write_bytes(b"submit_time,duration,gpus\n0,10,1\n\xff\xfe\x00\x81binary\x9c\n")
    rc = main(["simulate", "--trace", str(tr), "--gpus", "4", "--policy", "fifo", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("gandiva: error: "), err
    assert f"{name}: not UTF-8 text (byte 0xff)" in err
