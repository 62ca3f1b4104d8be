"""The demo's pure parts: workload, config, live table, verdict."""

from __future__ import annotations

from pathlib import Path

from slurm_gandiva.demo import (
    WORKLOAD,
    DemoJob,
    DemoResult,
    JobResult,
    JobRow,
    controller_config,
    failures,
    final_hash,
    job_state,
    render_table,
)
from slurm_gandiva.requeue.contract import Progress
from slurm_gandiva.slurm.base import HoldKind, SlurmJob


def _sj(state: str, restarts: int = 0, gpus: dict[str, tuple[int, ...]] | None = None) -> SlurmJob:
    return SlurmJob(
        "7",
        "a1",
        "gandiva-demo",
        state,
        "None",
        HoldKind.NONE,
        ("n1",),
        gpus or {},
        restart_count=restarts,
        end_time=50.0 if state == "COMPLETED" else 0.0,
    )


def _prog(samples: int) -> Progress:
    return Progress(
        step=samples // 32,
        epoch=0,
        samples=samples,
        total_samples=3840,
        batch_time_avg=0.1,
        samples_per_s=123.4,
        world_size=1,
        updated=10.0,
    )


def test_workload_is_twelve_jobs_about_twice_the_cluster() -> None:
    assert len(WORKLOAD) == 12
    assert {j.min_gpus for j in WORKLOAD} == {1, 2, 6}
    assert sum(j.min_gpus > 4 for j in WORKLOAD) == 1  # one job wider than a node (2 x 4 GPUs)
    assert any(j.max_gpus > j.min_gpus for j in WORKLOAD)
    demand = sum(j.min_gpus for j in WORKLOAD)
    assert 1.8 <= demand / 8 <= 2.5
    assert len({j.name for j in WORKLOAD}) == 12


def test_controller_config_is_valid_for_the_controller(tmp_path: Path) -> None:
    from slurm_gandiva.config import parse_config

    text = controller_config(
        state_dir=tmp_path / "ctl",
        jobs_dir=tmp_path / "jobs",
        topology=tmp_path / "t.json",
        slurm_conf=tmp_path / "slurm.conf",
        quantum=20,
        tick=3,
        policy="default",
    )
    cfg = parse_config(text, "demo.conf")
    assert (cfg.quantum, cfg.tick, cfg.policy) == (20.0, 3.0, "default")
    assert cfg.job_root == tmp_path / "jobs" and cfg.slurm_conf == tmp_path / "slurm.conf"
    assert not cfg.co_hold
    on = controller_config(state_dir=tmp_path, jobs_dir=tmp_path, topology=tmp_path / "t.json",
                           slurm_conf=tmp_path / "s.conf", quantum=20, tick=3, policy="gandiva", co_hold=True)
    assert parse_config(on, "demo.conf").co_hold
    assert cfg.round_log == tmp_path / "ctl" / "rounds.jsonl"  # for bench_sim_vs_real's round-by-round view


def test_job_states() -> None:
    j = WORKLOAD[0]
    assert job_state(JobRow("7", j, 0.0)) == "lost"
    assert job_state(JobRow("7", j, 0.0, _sj("PENDING"))) == "queued"
    assert job_state(JobRow("7", j, 0.0, _sj("PENDING", 1))) == "suspended"
    assert job_state(JobRow("7", j, 0.0, _sj("RUNNING"))) == "running"
    assert job_state(JobRow("7", j, 0.0, _sj("COMPLETED"), outcome="done")) == "done"
    assert job_state(JobRow("7", j, 0.0, _sj("COMPLETED"), outcome="failed")) == "failed"
    assert job_state(JobRow("7", j, 0.0, _sj("CANCELLED"))) == "cancelled"


def test_table_shows_each_job_compactly() -> None:
    j = DemoJob("e2", 1, 4, 120)
    rows = [
        JobRow("7", j, 0.0, _sj("RUNNING", 2, {"n1": (0, 1)}), _prog(1920)),
        JobRow("8", WORKLOAD[1], 0.0, _sj("PENDING")),
    ]
    text = render_table(rows, now=95.0, started=0.0, total_gpus=8)
    lines = text.splitlines()
    assert lines[0].startswith("t=   95s") and "running 1" in lines[0] and "queued 1" in lines[0]
    assert "GPUs busy 2/8" in lines[0]
    assert len(lines) == 4
    assert "1:4" in lines[2] and "n1:0+1" in lines[2] and "50%" in lines[2] and "123.4" in lines[2]
    assert lines[2].rstrip().endswith("3")  # third slice
    assert "queued" in lines[3] and "  0%" in lines[3]


def test_failures_and_hash(tmp_path: Path) -> None:
    out = tmp_path / "7.out"
    out.write_text("step 1\nfinal_params_sha256=abc\nCANCELLED DUE TO JOB REQUEUE\nfinal_params_sha256=def\n")
    assert final_hash(out) == "def"
    assert final_hash(tmp_path / "missing") is None
    j = WORKLOAD[0]
    ok = JobRow("7", j, 0.0, _sj("COMPLETED"), outcome="done")
    assert failures([ok], {"7": "def"}) == []
    assert failures([ok], {"7": None}) == ["job 7 (a1) finished without printing final_params_sha256="]
    assert failures([JobRow("9", j, 0.0)], {}) == ["job 9 (a1) ended lost"]


def test_results_round_trip() -> None:
    r = DemoResult(
        (JobResult("7", "a1", 1, 2, 640, 10.0, 12.0, 70.0, "done", 3, "abc"),), 5.0, 80.0, 20.0, "default", ()
    )
    back = DemoResult.from_json(r.to_json())
    assert back == r and back.jobs[0].jct == 60.0


def test_policy_params_reach_the_controller_config(tmp_path: Path) -> None:
    import pytest

    from slurm_gandiva.config import parse_config
    from slurm_gandiva.demo import policy_params
    from slurm_gandiva.errors import ConfigError
    from slurm_gandiva.selector import make_policy

    params = policy_params("default", 20.0, ["max_moves=2"])
    assert params == {"min_slice": "20", "probe": "20", "pack": "false", "max_moves": "2"}
    text = controller_config(state_dir=tmp_path, jobs_dir=tmp_path, topology=tmp_path / "t.json",
                             slurm_conf=tmp_path / "s.conf", quantum=20, tick=3, policy="default", params=params)
    cfg = parse_config(text, "demo.conf")
    assert cfg.params == {"min_slice": 20, "probe": 20, "pack": False, "max_moves": 2}
    policy = make_policy(cfg.policy, **cfg.params)
    assert getattr(policy, "min_slice") == 20
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        policy_params("default", 20.0, ["oops"])


def test_tenant_table_splits_the_contested_gpu_time() -> None:
    from slurm_gandiva.demo import TENANT_WORKLOAD, tenant_table

    assert {j.tenant for j in TENANT_WORKLOAD} == {0, 1}
    assert sum(j.min_gpus for j in TENANT_WORKLOAD if j.tenant == 0) == 8  # the search alone fills the cluster

    def res(jid: str, submitted: float, slices: tuple[tuple[float, float | None, int, str], ...]) -> JobResult:
        return JobResult(jid, jid, 1, 4, 100, submitted, slices[0][0], 100.0, "done", len(slices), "h", (), slices)

    # Tenant 0: job 1 holds 4 GPUs from 0 to 100, job 3 (submitted at 0) waits until 60 and runs on 1 GPU.
    # Tenant 1: job 2, submitted at 20, waits until 30 and holds 4 GPUs to 100. Both wait only from 20 to 30.
    results = [res("1", 0.0, ((0.0, 100.0, 4, "done"),)), res("3", 0.0, ((60.0, 100.0, 1, "done"),)),
               res("2", 20.0, ((30.0, 100.0, 4, "done"),))]
    table = tenant_table(results, {"1": 0, "3": 0, "2": 1}).splitlines()
    assert table[1].split() == ["vision", "gandiva-demo", "2", "440", "40", "100%", "100s"]
    assert table[2].split() == ["nlp", "gandiva-demo2", "1", "280", "0", "0%", "80s"]
