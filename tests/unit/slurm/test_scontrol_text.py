"""`scontrol show job -d -o` read as squeue --json records (Slurm 22.05, whose squeue --json ignores --jobs).

The lines in data/ were printed by the devcluster's 22.05.8; tests/integration/test_slurm_adapter.py checks the
reader against squeue --json on every supported release.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gandiva.slurm import parse, scontrol_text
from slurm_gandiva.slurm.base import HoldKind, SlurmJob
from slurm_gandiva.slurm.gres import requested_gres

LINES = (Path(__file__).parent / "data" / "scontrol_show_job_22.05.txt").read_text().splitlines()


def jobs(line: str) -> dict[str, SlurmJob]:
    return {j.job_id: j for j in parse.parse_squeue({"jobs": [scontrol_text.record(line)]})}


def test_a_running_job_with_spaces_in_its_name_and_comment() -> None:
    (job,) = jobs(LINES[0]).values()
    assert job.job_id == "1" and job.name == "my job" and job.comment == "gandiva x"
    assert job.user == "root" and job.state == "RUNNING" and job.hold is HoldKind.NONE
    assert job.gpus == {"n1": (1, 2)} and job.shards == {}
    assert requested_gres(job.tres_per_node) == requested_gres("gpu:g1:1,gpu:g2:1")
    assert job.min_cpus_per_node == 1 and job.end_time > job.start_time > 0


def test_an_arrays_waiting_tasks_and_a_running_task() -> None:
    waiting = jobs(LINES[1])
    assert sorted(waiting) == ["2_0", "2_2", "2_3", "2_4", "2_5"]
    assert all(j.hold is HoldKind.USER and j.array_max_tasks == 2 for j in waiting.values())
    (task,) = jobs(LINES[2]).values()
    assert task.job_id == "2_1" and task.shards == {"n1": (0,)} and task.state == "RUNNING"


def test_a_job_on_two_nodes_has_its_gpus_on_each() -> None:
    (job,) = jobs(LINES[3]).values()
    assert job.nodes == ("n1", "n2") and job.gpus == {"n1": (3,), "n2": (3,)}
    folded = LINES[3].replace(
        "Nodes=n1 CPU_IDs=1 Mem=0 GRES=gpu:g3:1(IDX:3)   Nodes=n2 CPU_IDs=0 Mem=0 GRES=gpu:g3:1(IDX:3)",
        "Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:g3:1(IDX:3)",
    )
    assert folded != LINES[3]
    assert jobs(folded)["3"].gpus == {"n1": (3,), "n2": (3,)}


def test_a_running_job_without_a_time_limit_has_no_end_yet() -> None:
    """scontrol prints EndTime=Unknown for it (squeue --json a date): read as 0, not as a parse failure; and a
    key scontrol prints only sometimes (ResizeTime) after it does not run into the date."""
    line = LINES[0].replace("EndTime=2027-11-26T14:33:03 ", "EndTime=Unknown ")
    assert line != LINES[0] and jobs(line)["1"].end_time == 0
    end = "EndTime=2027-11-26T14:33:03 "
    line = LINES[0].replace(end, end + "ResizeTime=2026-11-26T14:40:00 ")
    assert jobs(line)["1"].end_time > 0


def test_records_keys_them_by_slurms_job_id() -> None:
    assert sorted(scontrol_text.records("\n".join(LINES))) == ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    "name",
    [
        "x JobState=COMPLETED",  # twice
        "x JOB_GRES=gpu:1 Nodes=n2 GRES=gpu:g0:1(IDX:0)",  # a node detail, and out of its place
        "x ArrayJobId=7",  # out of its place
        "x TresPerNode=gpu:g0:4",  # out of its place
    ],
)
def test_a_job_name_that_forges_a_key_refuses_the_record(name: str) -> None:
    line = LINES[0].replace("JobName=my job ", f"JobName={name} ")
    with pytest.raises(parse.ParseError):
        scontrol_text.record(line)


def test_a_comment_that_forges_an_array_task_refuses_the_record() -> None:
    line = LINES[0].replace("Comment=gandiva x ", "Comment=gandiva ArrayJobId=5 ArrayTaskId=3 ")
    with pytest.raises(parse.ParseError):
        scontrol_text.record(line)


def test_words_that_name_no_key_stay_in_the_value() -> None:
    line = LINES[0].replace("JobName=my job ", "JobName=lr=0.1 bs=64 ")
    assert jobs(line)["1"].name == "lr=0.1 bs=64"


def test_a_description_in_place_of_the_reason_is_refused() -> None:
    """A requeue-held job admin-held afterwards keeps slurmctld's description, which scontrol prints as its
    Reason: an admin hold would read as the owner's."""
    line = LINES[1].replace("Reason=JobHeldUser", "Reason=job_requeued_in_held_state")
    with pytest.raises(parse.ParseError, match="description"):
        scontrol_text.record(line)


def test_a_line_without_the_keys_it_needs_is_refused() -> None:
    with pytest.raises(parse.ParseError):
        scontrol_text.record("JobId=5 JobName=x")


def test_account_qos_and_memory_are_read() -> None:
    line = LINES[0].replace("Account=(null) QOS=(null)", "Account=physics QOS=normal")
    (job,) = jobs(line.replace("MinMemoryNode=0", "MinMemoryNode=2G")).values()
    assert (job.account, job.qos, job.min_memory_per_node) == ("physics", "normal", 2048)
    (plain,) = jobs(LINES[0]).values()
    assert (plain.account, plain.qos, plain.min_memory_per_node) == ("", "", 0)
    per_cpu = LINES[0].replace("MinMemoryNode=0", "MinMemoryCPU=500M")
    assert jobs(per_cpu)["1"].min_memory_per_node == 500  # MinCPUsNode=1
