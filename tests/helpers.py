"""Helpers shared by the test suite: running commands as another user, waiting for conditions, and
small builders for the domain model."""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from slurm_gandiva.model import GpuRef, Placement, Topology

T = TypeVar("T")

TEST_USER = "gandiva-test"
OTHER_USER = "gandiva-test2"  # the second ordinary user of the two-user tests

TWO_BY_FOUR = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)  # per node: switch 0 = GPUs 0,1; 1 = 2,3


def gp(node: str, *idx: int, shared: bool = False) -> Placement:
    """A placement on GPUs `idx` of `node` (as shards when `shared`)."""
    return Placement(tuple(GpuRef(node, i) for i in idx), shared=shared)


def ensure_user(name: str = TEST_USER) -> str:
    """Create a non-root login user `name` if missing (root only); returns the name."""
    try:
        pwd.getpwnam(name)
        return name
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise RuntimeError(f"user {name} is missing and only root can create it")
    proc = subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/bash", name], capture_output=True, text=True, check=False
    )
    try:
        pwd.getpwnam(name)  # another test session may have created it at the same moment
    except KeyError:
        raise RuntimeError(f"useradd {name} failed: {proc.stderr.strip()}") from None
    return name


def run_as(
    user: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    input: str | None = None,
    cwd: str | os.PathLike[str] = "/tmp",
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run argv as `user` (via runuser when root) with os.environ + env; never raises on a non-zero exit."""
    full = list(argv)
    if pwd.getpwnam(user).pw_uid != os.geteuid():
        full = ["runuser", "-u", user, "--", *full]
    return subprocess.run(
        full,
        env={**os.environ, **(env or {})},
        input=input,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(
    probe: Callable[[], T | Literal[False] | None],
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Call probe until it returns something truthy; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: T | Literal[False] | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def tails(paths: list[Path], lines: int = 12, width: int = 240) -> str:
    """The last `lines` lines (each cut to `width`) of each file of `paths`, under its name (a missing one: none)."""
    out: list[str] = []
    for path in paths:
        try:
            if not path.exists():
                out.append(f"== {path}: (none)")
                continue
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            out.append(f"== {path}: {exc.strerror}")
            continue
        out.append(f"== {path}")
        out.extend(x[:width] for x in text)
    return "\n".join(out)
