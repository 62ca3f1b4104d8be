"""CliBackend with fake Slurm commands on PATH: argv, stdin, error mapping, gres-update rules."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_gandiva.errors import InvalidRequest, PermissionDenied, SlurmError, SlurmUnreachable, UnknownJob
from slurm_gandiva.slurm import make_backend
from slurm_gandiva.slurm.base import SubmitRequest
from slurm_gandiva.slurm.cli_backend import CliBackend, _classify

FAKE = """#!/bin/sh
# Records its argv and stdin; prints $FAKE_OUT_<cmd>, exits $FAKE_RC_<cmd>.
name=$(basename "$0")
echo "$name $*" >> "$FAKE_LOG"
if [ "$name" = sbatch ]; then cat > "$FAKE_LOG.stdin"; fi
if [ "$name" = scontrol ] && [ "$1 $2" = "show config" ]; then
  printf 'Configuration data as of now\nSLURM_VERSION           = %s\n' "${FAKE_SLURM_VERSION:-22.05.8}"; exit 0
fi
if [ -n "${FAKE_FAIL_MATCH:-}" ] && echo "$*" | grep -q -- "$FAKE_FAIL_MATCH"; then
  echo "Invalid generic resource (gres) specification for job 7" >&2; exit 1
fi
eval out=\\"\\${FAKE_OUT_$name:-}\\"
eval err=\\"\\${FAKE_ERR_$name:-}\\"
eval rc=\\"\\${FAKE_RC_$name:-0}\\"
[ -n "$out" ] && printf '%s' "$out"
[ -n "$err" ] && printf '%s\\n' "$err" >&2
exit $rc
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("sbatch", "squeue", "sinfo", "scontrol", "scancel"):
        p = bin_dir / cmd
        p.write_text(FAKE)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def calls(log: Path) -> list[str]:
    """The commands run, but for `scontrol show config` (the backend's capability probe)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [c for c in lines if c != "scontrol show config"]


def scontrol_changes(log: Path) -> list[str]:
    """The scontrol commands run that change something (not `scontrol show`)."""
    return [c for c in calls(log) if c.startswith("scontrol") and not c.startswith("scontrol show")]


def squeue_json(*jobs: dict[str, object]) -> str:
    return json.dumps({"jobs": list(jobs), "errors": []})


def test_submit_always_requeue_append_and_script_on_stdin(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OUT_sbatch", "42;cluster\n")
    b = make_backend({"SLURM_CONF": "/x/slurm.conf"}, kind="cli")
    jid = b.submit(SubmitRequest("#!/bin/sh\necho hi\n", options=["--gres=gpu:g0:1", "-J", "a b"]))
    assert jid == "42"
    assert calls(fake) == ["sbatch --parsable --requeue --open-mode=append --gres=gpu:g0:1 -J a b"]
    assert Path(str(fake) + ".stdin").read_text() == "#!/bin/sh\necho hi\n"


def test_submit_garbage_output_is_an_error(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OUT_sbatch", "Submitted batch job\n")
    with pytest.raises(SlurmError, match="not a job id"):
        make_backend(kind="cli").submit(SubmitRequest("#!/bin/sh\n"))


def test_actions_argv(fake: Path) -> None:
    b = CliBackend()
    b.signal("7", "SIGUSR2")
    b.signal("7", "TERM", batch_only=False)
    b.requeue_hold("7")
    b.hold("7")
    b.release("7")
    b.update("7", nodelist="n2", starttime="now")
    b.cancel("7")
    assert calls(fake) == [
        "scancel --signal=USR2 --batch 7",
        "scancel --signal=TERM --full 7",
        "scontrol requeuehold 7",
        "scontrol hold 7",
        "scontrol release 7",
        "scontrol update jobid=7 nodelist=n2 starttime=now",
        "scancel 7",
    ]


@pytest.mark.parametrize("bad", ["7; rm -rf /", "-1", "", "7 8"])
def test_bad_job_ids_never_reach_slurm(fake: Path, bad: str) -> None:
    with pytest.raises(InvalidRequest):
        CliBackend().hold(bad)
    assert calls(fake) == []


def test_bad_update_fields(fake: Path) -> None:
    b = CliBackend()
    for fields in ({"jobid": "8"}, {"nodelist": "n1 n2"}, {"bad-key": "x"}, {"TresPerNode": ""}):
        with pytest.raises(InvalidRequest):
            b.update("7", **fields)
    assert calls(fake) == []


@pytest.mark.parametrize(
    ("stderr", "exc"),
    [
        ("scancel: error: Kill job error on job id 99: Invalid job id specified", UnknownJob),
        ("Access/permission denied for job 10", PermissionDenied),
        ("Unspecified error for job 9", PermissionDenied),
        ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
         SlurmUnreachable),
        ("Unexpected message received for job 5", SlurmUnreachable),
        ("sbatch: error: Invalid generic resource (gres) specification", InvalidRequest),
    ],
)
def test_stderr_maps_to_the_hierarchy(stderr: str, exc: type[SlurmError]) -> None:
    err = _classify("op", stderr, 1)
    assert type(err) is exc
    assert "\n" not in str(err)


def test_unreachable_message_says_what_to_do(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ERR_scontrol", "Unexpected message received for job 5")
    monkeypatch.setenv("FAKE_RC_scontrol", "1")
    with pytest.raises(SlurmUnreachable, match="gandiva devcluster status"):
        CliBackend().release("5")


def test_squeue_errors_with_exit_0_are_unreachable(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OUT_squeue", json.dumps(
        {"errors": [{"description": "Failed while looking for jobs", "source": "slurm_load_jobs"}], "jobs": []}))
    with pytest.raises(SlurmUnreachable, match="is slurmctld running"):
        CliBackend().jobs()


def test_missing_command_is_unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmUnreachable, match="not found"):
        CliBackend().jobs()


def test_cancel_of_a_finished_job_is_fine(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "FAKE_ERR_scancel", "scancel: error: Kill job error on job id 5: Job/step already completing or completed"
    )
    monkeypatch.setenv("FAKE_RC_scancel", "1")
    CliBackend().cancel("5")


def test_job_lookup(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report(monkeypatch, 3, "RUNNING")
    assert CliBackend().job("3").running
    with pytest.raises(UnknownJob):
        CliBackend().job("4")


def scontrol_line(job_id: int, state: str, reason: str = "None", tres: str = "") -> str:
    """A `scontrol show job -d -o` line as 22.05 prints it (the reader 22.05 gets single jobs from)."""
    return (
        f"JobId={job_id} JobName=train UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=0 Nice=0 "
        f"Account=(null) QOS=(null) JobState={state} Reason={reason} Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 SubmitTime=2026-11-26T14:33:01 StartTime=Unknown EndTime=Unknown "
        "Partition=gpu ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 MinCPUsNode=1 WorkDir=/home/alice "
        f"StdOut=/home/alice/out" + (f" TresPerNode={tres}" if tres else "") + "\n"
    )


def report(monkeypatch: pytest.MonkeyPatch, job_id: int, state: str, reason: str = "None", tres: str = "") -> None:
    """The fake squeue --json and scontrol show job both describe this one job."""
    fields = {"job_id": job_id, "job_state": state, "state_reason": reason, "tres_per_node": tres}
    monkeypatch.setenv("FAKE_OUT_squeue", squeue_json(fields))
    monkeypatch.setenv("FAKE_OUT_scontrol", scontrol_line(job_id, state, reason, tres))


def pending(monkeypatch: pytest.MonkeyPatch, tres: str) -> None:
    report(monkeypatch, 7, "PENDING", "JobHeldAdmin", tres)


def test_gpu_gres_change_clears_first(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake squeue always reports the new gres afterwards only if we point it there; report the target.
    pending(monkeypatch, "gres:gpu:g1:1")
    b = CliBackend()
    with pytest.raises(SlurmError, match="do not release"):  # the fake still says g1 afterwards
        b.update("7", gres="gpu:g2:1,gpu:g3:1")
    assert scontrol_changes(fake) == [
        "scontrol update jobid=7 TresPerNode=",
        "scontrol update jobid=7 gres=gpu:g2:1,gpu:g3:1",
    ]


def test_gres_change_to_the_same_gres_is_a_no_op(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pending(monkeypatch, "gres:gpu:g2:1,gres:gpu:g3:1")
    CliBackend().update("7", gres="gpu:g3:1,gpu:g2:1")
    assert not scontrol_changes(fake)


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ("gres:gpu:g1:1", "shard:g1:1", "between whole GPUs and shards"),
        ("gres:shard:g1:1", "gpu:g1:1", "between whole GPUs and shards"),
        ("gres:shard:g1:1", "shard:g2:1", "cannot take shards away"),
    ],
)
def test_gres_changes_slurm_gets_wrong_are_refused(
    fake: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, match: str
) -> None:
    pending(monkeypatch, old)
    with pytest.raises(InvalidRequest, match=match):
        CliBackend().update("7", gres=new)
    assert not scontrol_changes(fake)


def test_gres_change_needs_a_pending_job(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report(monkeypatch, 7, "RUNNING")
    with pytest.raises(InvalidRequest, match="hold it"):
        CliBackend().update("7", gres="gpu:g0:1")


def test_failed_gres_set_restores_the_old_gres(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pending(monkeypatch, "gres:gpu:g1:1,gres:gpu:g3:1")
    monkeypatch.setenv("FAKE_FAIL_MATCH", "gres=gpu:g9")
    with pytest.raises(InvalidRequest, match="Invalid generic resource"):
        CliBackend().update("7", gres="gpu:g9:1")
    assert scontrol_changes(fake) == [
        "scontrol update jobid=7 TresPerNode=",
        "scontrol update jobid=7 gres=gpu:g9:1",
        "scontrol update jobid=7 gres=gpu:g1:1,gpu:g3:1",
    ]


def test_capabilities_come_from_the_running_slurmctld_once(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SLURM_VERSION", "24.11.5")
    b = CliBackend()
    caps = b.capabilities()
    assert caps.release == (24, 11, 5) and b.capabilities() is caps
    assert fake.read_text().splitlines().count("scontrol show config") == 1


def test_job_lookup_uses_squeue_filters_where_slurm_honours_them(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SLURM_VERSION", "24.11.5")
    monkeypatch.setenv("FAKE_OUT_squeue", squeue_json({"job_id": 3, "job_state": "RUNNING"}))
    assert CliBackend().job("3").running
    assert "squeue --json --states=all --jobs=3" in calls(fake)
    monkeypatch.setenv("FAKE_SLURM_VERSION", "22.05.8")
    monkeypatch.setenv("FAKE_OUT_scontrol", scontrol_line(3, "RUNNING"))
    fake.unlink()
    assert CliBackend().job("3").running
    # 22.05's squeue --json ignores --jobs (it would list every job): scontrol reads the one job.
    assert calls(fake) == ["scontrol show job -d -o 3"]


def test_a_22_05_job_scontrol_cannot_read_unambiguously_is_read_from_json(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_OUT_squeue", squeue_json({"job_id": 3, "job_state": "RUNNING", "name": "x"}))
    forged = scontrol_line(3, "RUNNING").replace("JobName=train", "JobName=x JobState=X")
    monkeypatch.setenv("FAKE_OUT_scontrol", forged)
    job = CliBackend().job("3")
    assert job.running and job.name == "x"
    assert calls(fake) == ["scontrol show job -d -o 3", "squeue --json --states=all"]


@pytest.mark.parametrize(("old", "new"), [("gres/gpu:g1:1", "shard:g1:1"), ("gres/shard:g1:1", "gpu:g2:1"),
                                          ("gres/shard:g1:1", "shard:g2:1"), ("gres/gpu:g1:1", "gpu:g2:1")])
def test_gres_changes_are_one_update_where_slurm_replaces_and_switches(
    fake: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    monkeypatch.setenv("FAKE_SLURM_VERSION", "24.11.5")
    pending(monkeypatch, old)
    with pytest.raises(SlurmError, match="do not release"):  # the fake still reports the old gres afterwards
        CliBackend().update("7", gres=new)
    assert scontrol_changes(fake) == [f"scontrol update jobid=7 gres={new}"]


def test_22_05_reads_a_few_jobs_of_a_long_queue_one_scontrol_each(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """22.05's squeue --json lists every job whatever the filter (6 s at 10,000 jobs): a few jobs of a long queue
    are read with one `scontrol show job` each, a short queue (or many of its jobs) with one squeue --json."""
    report(monkeypatch, 3, "RUNNING")
    b = CliBackend()
    assert set(b.read_jobs(["3"])) == {"3"} and calls(fake) == ["squeue --json --states=all"]  # queue unknown
    fake.unlink()
    b._known = {str(i): ("", ()) for i in range(1000)}  # as the last snapshot saw it
    assert set(b.read_jobs(["3"])) == {"3"} and calls(fake) == ["scontrol show job -d -o 3"]
    fake.unlink()
    assert set(b.read_jobs([str(i) for i in range(3, 40)])) == {"3"} and calls(fake) == ["squeue --json --states=all"]
