"""The one atomic-write helper (requeue.contract.write_atomic and replace_atomic): modes, atomic replacement,
durability, the kept previous file, and no temp file left on error."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.requeue import contract
from slurm_gandiva.requeue.contract import fsync_dir, replace_atomic, stale_temps, write_atomic


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o077)  # cuts group and other bits from every file the process creates
    yield
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.mark.parametrize("want", [0o600, 0o644])
def test_the_file_gets_exactly_its_mode_whatever_the_umask(tmp_path: Path, umask: None, want: int) -> None:
    p = tmp_path / "f.json"
    write_atomic(p, "{}\n", mode=want)
    assert p.read_text() == "{}\n" and mode(p) == want
    p.chmod(0o666)
    write_atomic(p, b"x", mode=want)  # a replaced file does not lend its mode
    assert p.read_bytes() == b"x" and mode(p) == want


def test_the_default_mode_is_the_job_files_0600(tmp_path: Path) -> None:
    write_atomic(tmp_path / "f", "a")
    assert mode(tmp_path / "f") == contract.FILE_MODE == 0o600


def test_the_old_file_stays_whole_until_the_new_one_is_renamed_over_it(tmp_path: Path) -> None:
    p = tmp_path / "f"
    write_atomic(p, "old")
    seen: list[str] = []

    def write(fd: int) -> None:
        os.write(fd, b"ne")
        seen.append(p.read_text())  # half-way: readers still get the old file
        assert len(stale_temps(p)) == 1
        os.write(fd, b"w")

    write_atomic(p, write)
    assert seen == ["old"] and p.read_text() == "new"
    assert [q.name for q in tmp_path.iterdir()] == ["f"]


def test_no_temp_file_is_left_and_the_old_file_stays_on_error(tmp_path: Path) -> None:
    p = tmp_path / "f"
    write_atomic(p, "old")

    def fail(fd: int) -> None:
        os.write(fd, b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(p, fail, durable=True)
    assert p.read_text() == "old" and [q.name for q in tmp_path.iterdir()] == ["f"]


def test_a_link_at_the_path_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("theirs")
    link = tmp_path / "f"
    link.symlink_to(target)
    write_atomic(link, "mine")
    assert not link.is_symlink() and link.read_text() == "mine" and target.read_text() == "theirs"


def test_durable_fsyncs_the_file_and_the_directory_else_nothing(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "a", "x")
    assert synced == []
    write_atomic(tmp_path / "a", "y", durable=True)
    assert synced == [False, True]  # the file before the rename, its directory after
    synced.clear()
    fsync_dir(tmp_path)
    assert synced == [True]


def test_keep_keeps_the_replaced_file_and_the_path_is_never_missing(tmp_path: Path) -> None:
    p, prev = tmp_path / "ckpt", tmp_path / "ckpt.prev"
    write_atomic(p, "1", keep=prev)
    assert p.read_text() == "1" and not prev.exists()  # nothing to keep yet
    write_atomic(p, "2", keep=prev)
    assert p.read_text() == "2" and prev.read_text() == "1" and mode(prev) == 0o600
    assert sorted(q.name for q in tmp_path.iterdir()) == ["ckpt", "ckpt.prev"]


def test_keep_copies_where_the_filesystem_has_no_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, prev = tmp_path / "ckpt", tmp_path / "ckpt.prev"
    write_atomic(p, "1")

    def no_link(*_a: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    write_atomic(p, "2", keep=prev)
    assert p.read_text() == "2" and prev.read_text() == "1" and mode(prev) == 0o600


def test_replace_atomic_takes_a_temp_file_written_by_someone_else(tmp_path: Path, umask: None) -> None:
    p, prev, tmp = tmp_path / "lightning.ckpt", tmp_path / "lightning.prev.ckpt", tmp_path / "lightning.ckpt.tmp.1"
    write_atomic(p, "old", mode=0o644)
    tmp.write_text("new")
    tmp.chmod(0o644)
    replace_atomic(tmp, p, durable=True, keep=prev)
    assert p.read_text() == "new" and mode(p) == 0o600 and prev.read_text() == "old" and not tmp.exists()


def test_replace_atomic_removes_the_temp_file_on_error(tmp_path: Path) -> None:
    tmp = tmp_path / "t"
    tmp.write_text("new")
    with pytest.raises(OSError):
        replace_atomic(tmp, tmp_path / "missing-dir" / "f")
    assert list(tmp_path.iterdir()) == []


def test_stale_temps_are_only_those_of_that_file(tmp_path: Path) -> None:
    for name in (".f.1234.tmp", ".f.abcd.tmp", ".g.1234.tmp", "f.tmp", "f"):
        (tmp_path / name).write_text("")
    assert [q.name for q in stale_temps(tmp_path / "f")] == [".f.1234.tmp", ".f.abcd.tmp"]
