"""Park and unpark (issue 31): the request file's checks, and gandiva-wrapper running examples/train.py parked
and unparked in place (real processes, CPU; no Slurm), on one "node" and on two (a stand-in for srun)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from slurm_gandiva.requeue.contract import (
    PARK_SIGNAL,
    ExitCode,
    JobFiles,
    ParkRequestError,
    Progress,
    read_park_request,
    read_progress,
    write_park_request,
)
from tests.unit.wrapper.test_wrapper_process import HASH_RE, TOTAL_STEPS, Run, finish_hash, start

pytestmark = pytest.mark.timeout(300)
NOBODY = 65534


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(run: Run, action: str, seq: int) -> None:
    write_park_request(run.files.park_request, action, seq, None)
    os.kill(run.proc.pid, PARK_SIGNAL)


def wait_progress(run: Run, state: str, seq: int, timeout: float = 60.0) -> Progress:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        prog = read_progress(run.files.progress)
        if prog is not None and prog.state == state and prog.request_seq == seq:
            return prog
        assert run.proc.poll() is None, run.output()
        time.sleep(0.01)
    raise AssertionError(f"not {state} for request {seq} in {timeout}s: {read_progress(run.files.progress)}")


def child_pid(run: Run) -> int:
    ev = run.wait_event("start")
    children = ev["children"]
    assert isinstance(children, list) and len(children) == 1
    pid: int = children[0]
    return pid


# -- the request file ----------------------------------------------------------------------------------------


def test_request_round_trip_and_refusals(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    assert read_park_request(files.park_request) is None
    write_park_request(files.park_request, "park", 3, "42", now=1.0)
    assert (files.park_request.stat().st_mode & 0o777) == 0o644
    req = read_park_request(files.park_request, owner=os.geteuid(), job_id="42")
    assert req is not None and (req.action, req.seq, req.job_id) == ("park", 3, "42")
    with pytest.raises(ParkRequestError, match="not 43"):
        read_park_request(files.park_request, owner=os.geteuid(), job_id="43")
    with pytest.raises(ParkRequestError, match="belongs to"):
        read_park_request(files.park_request, owner=os.geteuid() + 1)
    os.chmod(files.park_request, 0o664)
    with pytest.raises(ParkRequestError, match="writable by others"):
        read_park_request(files.park_request, owner=os.geteuid())
    link = tmp_path / "link.json"
    link.symlink_to(files.park_request)
    with pytest.raises(ParkRequestError, match="cannot open"):
        read_park_request(link, owner=os.geteuid())
    files.park_request.write_text('{"action": "explode", "seq": 1}')
    os.chmod(files.park_request, 0o644)
    with pytest.raises(ParkRequestError, match="not park or unpark"):
        read_park_request(files.park_request, owner=os.geteuid())
    with pytest.raises(ValueError, match="use one of"):
        write_park_request(files.park_request, "explode", 1, None)


def test_progress_carries_the_parked_fields() -> None:
    prog = Progress(step=3, epoch=0, samples=48, total_samples=None, batch_time_avg=0.1, samples_per_s=1.0,
                    world_size=1, updated=1.0, state="parked", parked_bytes=1234, request_seq=5)
    assert Progress.from_mapping(json.loads(prog.to_json())) == prog
    old = {k: v for k, v in json.loads(prog.to_json()).items() if k not in ("parked_bytes", "request_seq")}
    assert Progress.from_mapping(old).parked_bytes is None


def test_a_park_whose_device_state_does_not_fit_host_memory_is_declined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device state larger than the host memory left (the cgroup's --mem, or the node's) is not moved: the
    rank declines (False: the caller checkpoints and leaves by the requeue path), nothing is moved."""
    import torch

    from job_wrapper import park as park_mod

    model = torch.nn.Linear(256, 256, device="meta")  # "device" state without memory: 263 kB of it
    need = park_mod.device_bytes([model])
    assert need == (256 * 256 + 256) * 4 and park_mod.device_bytes([torch.nn.Linear(4, 4)]) == 0
    files = JobFiles(tmp_path)
    ctl = park_mod.ParkControl(files, 0)
    monkeypatch.setattr(park_mod, "host_room", lambda: need)  # the margin leaves too little room
    reported: list[int] = []
    ok = ctl.park(3, 10, [model], total_bytes=lambda mine: mine, on_parked=lambda b, s: reported.append(b),
                  on_unparked=lambda s: None, suspend_requested=lambda: False)
    assert ok is False and reported == [] and not ctl.parked and ctl.handled == 3
    assert model.weight.device.type == "meta"
    events = [json.loads(line) for line in files.events.read_text().splitlines()]
    assert [(e["event"], e["device_bytes"], e["host_room"]) for e in events] == [("park_declined", need, need)]
    room = park_mod.host_room()
    assert room is None or room > 0  # this machine's own reading: the cgroup's room, else MemAvailable


def test_the_parked_event_is_written_before_the_controller_can_read_parked(tmp_path: Path) -> None:
    """The controller freezes a job (SIGSTOP) as soon as its report says "parked": the "parked" event must be in
    the job's log by then, or it is written at the thaw, with the time of a park that seems to end turns later
    (two co-held jobs' logs then show them computing at once)."""
    import torch

    from job_wrapper import park as park_mod

    files = JobFiles(tmp_path)
    ctl = park_mod.ParkControl(files, 0)
    logged_at_report: list[list[str]] = []

    def on_parked(nbytes: int, seq: int) -> None:
        logged_at_report.append([json.loads(ln)["event"] for ln in files.events.read_text().splitlines()])

    ok = ctl.park(5, 7, [torch.nn.Linear(4, 4)], total_bytes=lambda mine: mine, on_parked=on_parked,
                  on_unparked=lambda s: None, suspend_requested=lambda: True)
    assert ok is False  # the suspend it was handed ends the park at once
    assert logged_at_report == [["parked"]]


# -- real processes ------------------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the request must be root's (and chown needs root)")


@needs_root
def test_parked_four_times_ends_bit_identical_and_parked_uses_no_cpu(tmp_path: Path) -> None:
    ref, _ = finish_hash(tmp_path / "ref")
    run = start(tmp_path / "park")
    pid = child_pid(run)
    step = 0
    for turn in range(4):
        step = run.wait_step(step + 5)
        park_seq, unpark_seq = 2 * turn + 1, 2 * turn + 2
        request(run, "park", park_seq)
        parked = wait_progress(run, "parked", park_seq)
        assert parked.parked_bytes is not None and parked.parked_bytes > 0
        if turn == 0:  # parked: no training, no CPU (the progress thread is stopped too)
            time.sleep(0.3)
            before = cpu_seconds(pid)
            time.sleep(2.0)
            used = cpu_seconds(pid) - before
            assert used <= 0.05, f"a parked process used {used:.3f} s of CPU in 2 s"
            prog = read_progress(run.files.progress)
            assert prog is not None and prog.step == parked.step and prog.state == "parked"
        request(run, "unpark", unpark_seq)
        wait_progress(run, "running", unpark_seq)
        step = run.wait_step(parked.step + 1)  # training again, in the same process
    assert run.finish() == ExitCode.DONE, run.output()
    events = run.events()
    assert [e["seq"] for e in events if e["event"] == "parked"] == [1, 3, 5, 7]
    assert [e["seq"] for e in events if e["event"] == "unparked"] == [2, 4, 6, 8]
    assert not [e for e in events if e["event"] in ("checkpoint", "resumed")]
    assert [e["pid"] for e in events if e["event"] == "unparked"] == [pid] * 4
    m = HASH_RE.search(run.output())
    assert m and m.group(1) == ref
    assert step < TOTAL_STEPS


@needs_root
def test_refused_requests_and_an_unpark_when_running_leave_the_job_training(tmp_path: Path) -> None:
    ref, _ = finish_hash(tmp_path / "ref")
    run = start(tmp_path / "job")
    step = run.wait_step(3)
    request(run, "unpark", 1)  # not parked: a no-op
    run.wait_event("unpark_ignored")
    write_park_request(run.files.park_request, "park", 2, None)
    os.chown(run.files.park_request, NOBODY, NOBODY)  # not root's: anyone could have written it
    os.kill(run.proc.pid, PARK_SIGNAL)
    first = run.wait_event("park_refused")
    assert "belongs to" in str(first["reason"])
    step = run.wait_step(step + 5)
    write_park_request(run.files.park_request, "park", 3, None)
    os.chmod(run.files.park_request, 0o666)  # root's, but others may change it
    os.kill(run.proc.pid, PARK_SIGNAL)
    refused = [e for e in run.events() if e["event"] == "park_refused"]
    deadline = time.monotonic() + 30
    while len(refused) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        refused = [e for e in run.events() if e["event"] == "park_refused"]
    assert len(refused) == 2 and "writable by others" in str(refused[1]["reason"]), refused
    run.wait_step(step + 5)
    assert run.finish() == ExitCode.DONE, run.output()
    assert not [e for e in run.events() if e["event"] == "parked"]
    assert all(p.state != "parked" for p in [read_progress(run.files.progress)] if p)
    m = HASH_RE.search(run.output())
    assert m and m.group(1) == ref


@needs_root
def test_two_ranks_park_at_the_same_step_and_end_bit_identical(tmp_path: Path) -> None:
    ref, _ = finish_hash(tmp_path / "ref", nprocs=2)
    run = start(tmp_path / "park", nprocs=2)
    step = run.wait_step(5)
    request(run, "park", 1)
    parked = wait_progress(run, "parked", 1)
    ev = run.wait_event("parked")
    assert ev["step"] == parked.step >= step and parked.parked_bytes is not None and parked.parked_bytes > 0
    time.sleep(0.5)
    prog = read_progress(run.files.progress)
    assert prog is not None and prog.step == parked.step  # neither rank trains on alone
    request(run, "unpark", 2)
    wait_progress(run, "running", 2)
    assert run.finish() == ExitCode.DONE, run.output()
    m = HASH_RE.search(run.output())
    assert m and m.group(1) == ref


FAKE_SRUN = Path(__file__).with_name("_fake_srun.py")


@needs_root
def test_a_job_on_two_nodes_parks_and_unparks_on_both_promptly_and_ends_bit_identical(tmp_path: Path) -> None:
    """The park signal reaches only the batch wrapper (as `scancel --batch` sends it); the ranks run under the
    node launchers srun started, one a node. Both park at one step and both go on at once after the unpark
    (a rank left to its own recheck of the request would hold the other in its next collective for 30 s)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_SRUN} "$@"\n')
    (fake / "srun").chmod(0o755)
    ref, _ = finish_hash(tmp_path / "ref", nprocs=2)
    run = start(tmp_path / "park", env={"SLURM_JOB_NUM_NODES": "2", "GANDIVA_MASTER_ADDR": "127.0.0.1",
                                        "PATH": f"{fake}:{os.environ['PATH']}"})
    step = run.wait_step(5)
    for turn in range(2):
        park_seq, unpark_seq = 2 * turn + 1, 2 * turn + 2
        request(run, "park", park_seq)
        parked = wait_progress(run, "parked", park_seq, timeout=10.0)
        assert parked.step >= step
        time.sleep(0.5)
        prog = read_progress(run.files.progress)
        assert prog is not None and prog.step == parked.step and prog.state == "parked"
        request(run, "unpark", unpark_seq)
        wait_progress(run, "running", unpark_seq, timeout=10.0)
        step = run.wait_step(parked.step + 2, timeout=10.0)
    assert run.finish() == ExitCode.DONE, run.output()
    events = run.events()
    ranks = {int(p) for e in events if e["event"] == "node_start" for p in e["children"]}  # type: ignore[attr-defined]
    assert len(ranks) == 2
    woken = [e for e in events if e["event"] == "park_signal" and "forwarded_to" in e]
    assert len(woken) == 8 and {int(p) for e in woken for p in e["forwarded_to"]} == ranks  # type: ignore[attr-defined]
    assert [e["seq"] for e in events if e["event"] == "unparked"] == [2, 4]
    assert not [e for e in events if e["event"] in ("checkpoint", "resumed")]
    m = HASH_RE.search(run.output())
    assert m and m.group(1) == ref
