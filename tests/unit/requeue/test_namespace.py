"""The private directory of a submission (requeue.namespace): the comment that names it, and the checks the
controller makes before it trusts it (a real directory directly under the jobs root, the job's user's,
writable by no one else)."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from slurm_gandiva.errors import JobFileError
from slurm_gandiva.requeue.namespace import (
    check_private_dir,
    is_marked,
    job_comment,
    job_paths,
    make_private_dir,
    private_name,
)

ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.mark.parametrize(
    ("comment", "marked", "name"),
    [
        ("gandiva", True, None),
        (" gandiva ", True, None),
        ("gandiva:alice.x1y2", True, "alice.x1y2"),
        ("gandiva:", True, ""),
        ("gandiva:../etc", True, "../etc"),
        ("gandivax", False, None),
        ("xgandiva:a", False, None),
        ("", False, None),
    ],
)
def test_the_comment_marks_the_job_and_names_its_directory(comment: str, marked: bool, name: str | None) -> None:
    assert is_marked(comment) is marked
    assert private_name(comment) == name


def test_a_private_directory_is_new_unguessable_and_private(tmp_path: Path) -> None:
    old = os.umask(0)  # mkdir's mode must not depend on the caller's umask
    try:
        a = make_private_dir(tmp_path, "alice")
        b = make_private_dir(tmp_path, "alice")
    finally:
        os.umask(old)
    assert a != b and a.parent == tmp_path and a.name.startswith("alice.")
    st = os.lstat(a)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert private_name(job_comment(a.name)) == a.name
    assert make_private_dir(tmp_path, "a/b:c").name.startswith("a_b_c.")  # one path component, whatever the name


def test_a_good_directory_is_accepted(tmp_path: Path) -> None:
    d = make_private_dir(tmp_path, ME)
    assert check_private_dir(tmp_path, d.name, os.geteuid()) == d
    p = job_paths(tmp_path, "7_3", job_comment(d.name), ME)
    assert (p.state_dir, p.spec) == (d / "7_3", d / "7_3.json")


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "spec", ".hidden", "x" * 200])
def test_names_that_are_not_one_plain_component_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(JobFileError, match="not a gandiva directory") as ei:
        check_private_dir(tmp_path, name, os.geteuid())
    assert "\n" not in str(ei.value)


def test_a_link_is_refused_even_to_a_good_directory(tmp_path: Path) -> None:
    d = make_private_dir(tmp_path, ME)
    (tmp_path / "alice.link").symlink_to(d)
    with pytest.raises(JobFileError, match=r"not a directory \(a link\?\)"):
        check_private_dir(tmp_path, "alice.link", os.geteuid())


def test_a_file_or_a_missing_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "alice.file").write_text("")
    with pytest.raises(JobFileError, match="not a directory"):
        check_private_dir(tmp_path, "alice.file", os.geteuid())
    with pytest.raises(JobFileError, match="does not exist"):
        check_private_dir(tmp_path, "alice.gone", os.geteuid())


@pytest.mark.parametrize("mode", [0o770, 0o702, 0o1777])
def test_a_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    d = make_private_dir(tmp_path, ME)
    d.chmod(mode)
    with pytest.raises(JobFileError, match="writable by others"):
        check_private_dir(tmp_path, d.name, os.geteuid())


def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    d = make_private_dir(tmp_path, ME)
    with pytest.raises(JobFileError, match=f"belongs to uid {os.geteuid()}, not to the job's user"):
        check_private_dir(tmp_path, d.name, os.geteuid() + 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
def test_a_job_naming_another_users_directory_is_refused(tmp_path: Path) -> None:
    victim = make_private_dir(tmp_path, "victim")
    os.chown(victim, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(JobFileError, match="not to the job's user"):
        job_paths(tmp_path, "12", job_comment(victim.name), "root")
    assert job_paths(tmp_path, "12", job_comment(victim.name), "nobody").state_dir == victim / "12"


def test_an_unknown_user_or_bad_job_id_is_refused(tmp_path: Path) -> None:
    d = make_private_dir(tmp_path, ME)
    with pytest.raises(JobFileError, match="unknown on the controller's host"):
        job_paths(tmp_path, "12", job_comment(d.name), "no-such-user-here")
    with pytest.raises(JobFileError, match="bad job id"):
        job_paths(tmp_path, "../12", job_comment(d.name), ME)


def test_the_old_mark_keeps_the_old_layout(tmp_path: Path) -> None:
    p = job_paths(tmp_path, "12", "gandiva", "anyone")
    assert (p.state_dir, p.spec) == (tmp_path / "12", tmp_path / "spec" / "12.json")
