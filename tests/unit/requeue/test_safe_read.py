"""A job's files are untrusted input to the root controller: links, FIFOs, directories, huge or foreign files
are refused with one line (JobFileError), never followed, waited on or read."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from slurm_gandiva.errors import JobFileError
from slurm_gandiva.requeue.contract import Progress
from slurm_gandiva.requeue.safe_read import (
    MAX_JSON_BYTES,
    read_job_json,
    read_job_outcome,
    read_job_progress,
    read_job_text,
)

PROGRESS = Progress(step=3, epoch=0, samples=96, total_samples=960, batch_time_avg=0.1, samples_per_s=320.0,
                    world_size=1, updated=1000.0)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


def refused(path: Path, *, owner: str | int = "root", timeout: float = 5.0) -> str:
    """The one-line reason a read of `path` is refused (failing if the read hangs or succeeds)."""
    box: list[BaseException | object] = []

    def read() -> None:
        try:
            box.append(read_job_json(path, owner=owner))
        except BaseException as exc:  # reported to the test thread
            box.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"reading {path} blocked"
    [got] = box
    assert isinstance(got, JobFileError), f"{path} was read: {got!r}"
    msg = str(got)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_a_good_file_is_read_and_a_missing_one_is_none(tmp_path: Path) -> None:
    f = tmp_path / "progress.json"
    f.write_text(PROGRESS.to_json())
    assert read_job_progress(f, owner="root") == PROGRESS
    assert read_job_progress(tmp_path / "none.json", owner="root") is None
    assert read_job_progress(tmp_path / "nodir" / "progress.json", owner="root") is None
    (tmp_path / "status.json").write_text('{"outcome": "suspended"}')
    assert read_job_outcome(tmp_path / "status.json", owner=0) == "suspended"


def test_binary_bytes_and_garbage_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "progress.json"
    f.write_bytes(b"\xff\xfe\x00\x81garbage")
    assert "not UTF-8" in refused(f)
    f.write_text("{not json")
    assert "not JSON" in refused(f)
    f.write_text("[" * 100_000 + "]" * 100_000)  # deeper than json's recursion limit
    assert "not JSON" in refused(f)
    f.write_text(json.dumps({"step": "many"}))
    with pytest.raises(JobFileError, match="malformed progress"):
        read_job_progress(f, owner="root")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "progress.json").mkdir()
    assert "is a directory" in refused(tmp_path / "progress.json")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    f = tmp_path / "progress.json"
    os.mkfifo(f)
    assert "is a FIFO" in refused(f, timeout=5.0)


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text(PROGRESS.to_json())
    (tmp_path / "progress.json").symlink_to(real)
    assert "symbolic link" in refused(tmp_path / "progress.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert "symbolic link" in refused(tmp_path / "zero.json")
    (tmp_path / "linked-dir").symlink_to(tmp_path)  # a job directory replaced by a link to elsewhere
    assert "not a directory (or is a link)" in refused(tmp_path / "linked-dir" / "real.json")


def test_a_huge_file_is_refused_and_a_tail_is_read_from_a_whole_line(tmp_path: Path) -> None:
    f = tmp_path / "progress.json"
    with f.open("wb") as fh:
        fh.truncate(MAX_JSON_BYTES + 1)
    assert "more than" in refused(f)
    with f.open("wb") as fh:
        fh.truncate(64 << 30)  # sparse: 64 GiB that nobody should try to read
    assert "more than" in refused(f)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"event": "x", "n": i}) + "\n" for i in range(1000)))
    text = read_job_text(events, owner="root", max_bytes=100, tail=True)
    assert text is not None and text.endswith('"n": 999}\n')
    assert all(json.loads(line)["event"] == "x" for line in text.splitlines())


@root_only
def test_a_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "progress.json"
    f.write_text(PROGRESS.to_json())
    os.chown(f, 54321, 54321)
    msg = refused(f, owner="nobody")
    assert "owned by uid 54321" in msg and "nobody" in msg
    os.chown(f, 65534, 65534)
    assert read_job_progress(f, owner=65534) == PROGRESS  # the job's user's own file
    assert "owned by uid 65534" in refused(f, owner="alice-not-on-this-host")  # unknown user: root's files only
