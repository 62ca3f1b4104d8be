"""Suite-wide fixtures: the real local Slurm cluster (session), a backend bound to it, a non-root user.

Environment:
  GANDIVA_TEST_STATE_DIR   state dir of the session cluster (kept running afterwards); else a temp dir
                           (stopped and removed at the end of the session)
  GANDIVA_TEST_PORT_BASE   port base (slurmctld = base+17, slurmd = base+101..); default 16800
A cluster that cannot start FAILS the tests that need it; it is never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gandiva.devcluster.cluster import DevCluster
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SlurmBackend
from tests.helpers import TEST_USER, ensure_user, tails


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use the real cluster (the `slurm_cluster` fixture, directly or through `slurm` and
    `slurm_env`) get the `slurm` marker (select with -m slurm / -m 'not slurm'). Unit tests whose fake
    backend fixture is also called `slurm` do not: their closure has no `slurm_cluster`. Then every test
    must be in the folder its markers say (`_misplaced`), else the run stops before any test runs."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
    misplaced = [f"{item.nodeid}: {why}" for item in items if (why := _misplaced(item))]
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder:\n  " + "\n  ".join(misplaced))


_TESTS = Path(__file__).resolve().parent
_INTEGRATION_MARKS = ("slurm", "pyslurm", "postgres")


def _misplaced(item: pytest.Item) -> str:
    """Why `item` is in the wrong folder ("" if it is not): a test that needs a real Slurm or PostgreSQL
    (marked slurm, pyslurm or postgres) lives in tests/integration/, every other test in tests/unit/."""
    path = item.path.resolve()
    if not path.is_relative_to(_TESTS):
        return ""
    marks = [m for m in _INTEGRATION_MARKS if item.get_closest_marker(m) is not None]
    folder = path.relative_to(_TESTS).parts[0]
    if folder == "integration":
        return "" if marks else "marked none of slurm, pyslurm, postgres: it belongs in tests/unit/"
    if folder == "unit":
        return f"marked {', '.join(marks)}: it belongs in tests/integration/" if marks else ""
    return "every test lives in tests/unit/ or tests/integration/"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that needs the real cluster must never skip: its skip is turned into a failure. A real-Slurm test
    that fails shows the daemons' and its jobs' last lines, its controllers' logs and its jobs' stacks."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and item.get_closest_marker("slurm") is not None and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: a real-Slurm test was skipped ({report.longrepr}); it must run"
    funcargs: dict[str, object] = getattr(item, "funcargs", {})
    clusters = [c for c in funcargs.values() if isinstance(c, DevCluster)]  # slurm_cluster, acct_cluster
    if report.failed and call.when == "call" and clusters:
        # CI shows only the end of its output: what the daemons and the test's jobs last wrote, beside the failure.
        job_dir = funcargs.get("job_dir")
        jobs = sorted(job_dir.rglob("*")) if isinstance(job_dir, Path) else []
        texts = [p for p in jobs if p.suffix in (".out", ".err", ".json", ".jsonl", ".log")]
        report.sections.append(("the cluster's and the jobs' last lines",
                                tails([*(p for c in clusters for p in sorted(c.log_dir.glob("*.log"))), *texts])))
        tmp = funcargs.get("tmp_path")
        if isinstance(tmp, Path) and (logs := sorted(tmp.rglob("controller-*.log"))):
            report.sections.append(("the test's controllers' last lines", tails(logs, lines=40)))
        if isinstance(job_dir, Path) and (stacks := _stacks(job_dir)):
            report.sections.append(("where the test's jobs' Python processes are (py-spy)", stacks))


def _stacks(job_dir: Path, limit: int = 6, lines: int = 30) -> str:
    """py-spy's dump of up to `limit` live Python processes of jobs under `job_dir` (their GANDIVA_STATE_DIR),
    each cut to `lines` lines: a job that hangs shows where. Empty without py-spy."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return ""
    mark = f"GANDIVA_STATE_DIR={job_dir}/".encode()
    out: list[str] = []
    dumped = 0
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "python" not in cmd or not any(e.startswith(mark) for e in env):
            continue
        try:
            dump = subprocess.run([spy, "dump", "--pid", proc.name], capture_output=True, text=True, timeout=30,
                                  check=False)
        except subprocess.TimeoutExpired:
            continue
        out.append(f"== pid {proc.name}: {cmd[:200]}")
        out.extend((dump.stdout + dump.stderr).splitlines()[:lines])
        dumped += 1
        if dumped >= limit:
            break
    return "\n".join(out)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """A running DevCluster (2 nodes x 4 GPUs) shared by the whole session. Fails if it cannot start."""
    if os.geteuid() != 0:
        pytest.fail("the Slurm integration tests need root (slurmd launches jobs as their users)")
    env_dir = os.environ.get("GANDIVA_TEST_STATE_DIR")
    state_dir = Path(env_dir) if env_dir else Path(tempfile.mkdtemp(prefix="gandiva-test-"))
    port_base = int(os.environ.get("GANDIVA_TEST_PORT_BASE", "16800"))
    cluster = DevCluster(state_dir, port_base=port_base)
    try:
        cluster.up()
    except Exception as exc:
        pytest.fail(f"the local Slurm cluster did not start: {exc}")
    yield cluster
    if not env_dir:
        cluster.down()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_env(slurm_cluster: DevCluster) -> dict[str, str]:
    """os.environ plus the session cluster's SLURM_CONF (for subprocesses)."""
    return {**os.environ, **slurm_cluster.env}


@pytest.fixture(scope="session")
def slurm(slurm_cluster: DevCluster) -> SlurmBackend:
    """The CLI SlurmBackend bound to the session cluster."""
    return make_backend(slurm_cluster.env)


@pytest.fixture(scope="session")
def test_user() -> str:
    """A non-root user (gandiva-test), created if missing."""
    try:
        return ensure_user(TEST_USER)
    except RuntimeError as exc:
        pytest.fail(str(exc))
