"""Lightning, Hugging Face Trainer and `job.loader()` jobs parked and unparked in place (issue 31, item 1):
gandiva-wrapper runs each in real processes (gloo on CPU; no Slurm), the controller's part is played by writing
root's request and sending the park signal to the wrapper. Each job is parked twice and unparked: while parked
neither it nor its DataLoader workers use CPU and no rank trains on; it ends in the same processes (no
checkpoint, no resume, the loader's workers the same) with the parameters of an uninterrupted run, bit for bit."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gandiva.requeue.contract import ExitCode, JobFiles, read_progress
from tests.unit.wrapper.test_wrapper_park import cpu_seconds, needs_root, request, wait_progress
from tests.unit.wrapper.test_wrapper_process import HASH_RE, WRAPPER, Run, finish_hash, start

pytestmark = [pytest.mark.timeout(300), needs_root]

JOB = Path(__file__).with_name("_multirank_job.py")
SHA = re.compile(r"final_params_sha256=([0-9a-f]{64}) steps=(\d+)")
FRAMEWORK_ARGS = ["--epochs", "4", "--sleep", "0.1"]  # 32 steps of 0.1 s
PARKED_CPU_S = 0.1  # the most CPU all of a parked job's processes may use in 2 s (the clock's tick is 0.01 s)


def start_framework(state: Path, framework: str, nprocs: int = 2) -> Run:
    state.mkdir(parents=True, exist_ok=True)
    log = state / "run.log"
    argv = [str(WRAPPER), "--state-dir", str(state), "--nprocs", str(nprocs), "--progress-interval", "0.1", "--",
            sys.executable, str(JOB), framework, *FRAMEWORK_ARGS]
    started = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return Run(proc, JobFiles(state), log, started)


def descendants(pid: int) -> set[int]:
    """`pid`'s processes below it (a rank's DataLoader workers), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def park_twice(run: Run) -> dict[int, set[int]]:
    """Park and unpark the job twice, checking each parked spell; returns each rank's processes below it (its
    DataLoader workers) as they were while first parked."""
    ranks = run.wait_event("start")["children"]
    assert isinstance(ranks, list) and ranks
    step = run.wait_step(3)
    below: dict[int, set[int]] = {}
    for turn in range(2):
        park_seq, unpark_seq = 2 * turn + 1, 2 * turn + 2
        request(run, "park", park_seq)
        parked = wait_progress(run, "parked", park_seq)
        assert parked.parked_bytes is not None and parked.parked_bytes > 0
        assert parked.step >= step
        if turn == 0:
            below = {r: descendants(r) for r in ranks}
            procs = [*ranks, *(p for ps in below.values() for p in ps)]
            time.sleep(0.3)
            before = sum(cpu_seconds(p) for p in procs)
            time.sleep(2.0)
            used = sum(cpu_seconds(p) for p in procs) - before
            assert used <= PARKED_CPU_S, f"{len(procs)} parked processes used {used:.3f} s of CPU in 2 s"
            prog = read_progress(run.files.progress)
            assert prog is not None and prog.state == "parked" and prog.step == parked.step  # no rank trains on
        request(run, "unpark", unpark_seq)
        wait_progress(run, "running", unpark_seq)
        step = run.wait_step(parked.step + 2)  # training again, in the same processes
    return below


def check_in_place(run: Run, nranks: int) -> None:
    events = run.events()
    assert [e["seq"] for e in events if e["event"] == "parked"] == [1, 3]
    assert [e["seq"] for e in events if e["event"] == "unparked"] == [2, 4]
    assert not [e for e in events if e["event"] in ("checkpoint", "resumed", "stop_requested")]
    exits = [e for e in events if e["event"] == "child_exit"]
    assert len(exits) == nranks and all(e["code"] == 0 for e in exits), exits


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_a_framework_job_parked_twice_ends_bit_identical_in_the_same_processes(tmp_path: Path,
                                                                                framework: str) -> None:
    pytest.importorskip("lightning" if framework == "lightning" else "transformers")
    ref = start_framework(tmp_path / "ref", framework)
    run = start_framework(tmp_path / "park", framework)
    park_twice(run)
    assert run.finish() == ExitCode.DONE, run.output()
    assert ref.finish() == ExitCode.DONE, ref.output()
    check_in_place(run, 2)
    got, want = SHA.search(run.output()), SHA.search(ref.output())
    assert got and want, run.output()
    assert got.groups() == want.groups() and want.group(2) == "32"


def test_a_loader_job_parked_twice_keeps_its_workers_and_ends_bit_identical(tmp_path: Path) -> None:
    workers = ["--loader-workers", "2"]
    ref, _ = finish_hash(tmp_path / "ref", extra=workers)
    run = start(tmp_path / "park", extra=workers)
    below = park_twice(run)
    (rank,) = below
    assert len(below[rank]) == 2, below  # the two workers, parked with their rank (their prefetched batches kept)
    assert descendants(rank) == below[rank]  # the same workers after both parks
    assert run.finish() == ExitCode.DONE, run.output()
    check_in_place(run, 1)
    m = HASH_RE.search(run.output())
    assert m and m.group(1) == ref
