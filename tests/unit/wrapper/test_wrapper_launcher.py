"""The wrapper's pure parts: GPUs -> ranks, child environments, outcome mapping, command line."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from job_wrapper.cli import parse_config
from job_wrapper.launcher import (
    MASTER_ADDR_ENV,
    Layout,
    UsageError,
    WrapperConfig,
    _node_result,
    _State,
    allocated_gpus,
    child_env,
    decide_outcome,
    gpu_env_var,
    job_nodes,
    master_addr,
    node_codes,
    plan_ranks,
    suspend_action,
)
from slurm_gandiva.requeue.contract import ExitCode, JobFiles


@pytest.mark.parametrize(
    "env, gpus",
    [
        ({}, ()),
        ({"CUDA_VISIBLE_DEVICES": "1,3"}, ("1", "3")),
        ({"CUDA_VISIBLE_DEVICES": "", "SLURM_STEP_GPUS": "2"}, ("2",)),
        ({"SLURM_JOB_GPUS": "0, 2,"}, ("0", "2")),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "5"}, ("5",)),
        ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "5,6"}, ("0",)),
    ],
)
def test_allocated_gpus(env: dict[str, str], gpus: tuple[str, ...]) -> None:
    assert allocated_gpus(env) == gpus
    var = gpu_env_var(env)
    assert (var is None) == (gpus == ()) and (var is None or env[var].strip().startswith(gpus[0]))


class _Child:
    """A stand-in for subprocess.Popen: running (returncode None) or exited."""

    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


@pytest.mark.parametrize(
    "codes, pending, done, expected",
    [
        ([None, None], False, False, None),  # first signal while training: forward it
        ([None, None], True, False, "a stop is already pending"),  # the controller signalled again
        ([0, None], False, False, "training is done"),  # rank 0 finished, rank 1 about to
        ([None], False, True, "training is done"),  # progress says done, the child is tearing down
        ([75, 75], False, False, "no training process is running"),
    ],
)
def test_suspend_action_forwards_only_the_first_signal_while_training(
    codes: list[int | None], pending: bool, done: bool, expected: str | None
) -> None:
    st = _State(children=[_Child(c) for c in codes], stop_pending=pending)  # type: ignore[misc]
    assert suspend_action(st, lambda: done) == expected


def test_plan_ranks() -> None:
    assert plan_ranks(None, ()) == (1, (None,))
    assert plan_ranks(3, ()) == (3, (None, None, None))
    assert plan_ranks(None, ("1", "3")) == (2, ("1", "3"))
    assert plan_ranks(1, ("1", "3")) == (1, ("1",))
    with pytest.raises(UsageError, match="exceeds the 2 GPUs"):
        plan_ranks(3, ("1", "3"))
    with pytest.raises(UsageError, match="at least 1"):
        plan_ranks(0, ())


def test_child_env_sets_torch_distributed_and_one_gpu(tmp_path: Path) -> None:
    cfg = WrapperConfig(command=("x",), state_dir=tmp_path, signal=signal.SIGUSR2, progress_interval=2.0)
    env = child_env({"CUDA_VISIBLE_DEVICES": "1,3", "KEEP": "1"}, 1, 2, "3", 29500, cfg)
    assert env["KEEP"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "3"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "1", "2", "29500")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["GANDIVA_STATE_DIR"] == str(tmp_path)
    assert env["GANDIVA_SIGNAL"] == "SIGUSR2" and env["GANDIVA_PROGRESS_INTERVAL"] == "2.0"
    assert env["GANDIVA_FAST_EXIT"] == "1"
    assert child_env({"CUDA_VISIBLE_DEVICES": ""}, 0, 1, None, 1, cfg)["CUDA_VISIBLE_DEVICES"] == ""
    # A frozen parked job must not be aborted by NCCL's heartbeat monitor on waking; the user's choice stands.
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "0"
    assert child_env({"TORCH_NCCL_ENABLE_MONITORING": "1"}, 0, 1, None, 1, cfg)["TORCH_NCCL_ENABLE_MONITORING"] == "1"


def test_child_env_on_the_second_of_two_nodes_numbers_ranks_across_nodes(tmp_path: Path) -> None:
    cfg = WrapperConfig(command=("x",), state_dir=tmp_path)
    layout = Layout(node=1, nodes=2, local=4, addr="node1.example")
    env = child_env({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, 4, "2", 29500, cfg, layout)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("6", "2", "8", "4")
    assert (env["MASTER_ADDR"], env["GROUP_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("node1.example", "1", "2")


def test_job_nodes_and_the_rendezvous_address_override() -> None:
    assert job_nodes({}) == 1 and job_nodes({"SLURM_JOB_NUM_NODES": "3"}) == 3 and job_nodes({"SLURM_NNODES": "x"}) == 1
    assert master_addr({MASTER_ADDR_ENV: "10.0.0.7", "SLURMD_NODENAME": "n1"}) == "10.0.0.7"
    assert master_addr({"PATH": ""})  # outside Slurm: this host's name


def test_node_codes_in_rank_order_and_a_node_without_a_result_counts_as_killed(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    assert _node_result(files, Layout(node=1, nodes=3, local=2), [75, 75], "") == 0
    assert _node_result(files, Layout(node=0, nodes=3, local=2), [75, -9], "") == int(ExitCode.FAILED)
    codes, missing = node_codes(files, 3, 2)
    assert codes == [75, -9, 75, 75, None, None] and missing == ["node 2: no result from its launcher"]
    (tmp_path / "node-2.json").write_text('{"state": "exited", "codes": ["x", 1]}')  # the user's file: checked
    assert node_codes(files, 3, 2)[1] == ["node 2: no result from its launcher"]


@pytest.mark.parametrize(
    "codes, outcome, words",
    [
        ([0, 0], ExitCode.DONE, "finished"),
        ([75], ExitCode.SUSPENDED, "checkpointed"),
        ([75, 1], ExitCode.FAILED, "rank 1: exit 1"),
        ([75, None], ExitCode.FAILED, "rank 1: killed by the wrapper"),
        ([-9, 0], ExitCode.FAILED, "rank 0: killed by SIGKILL"),
        ([0, 75], ExitCode.FAILED, "disagree"),
    ],
)
def test_decide_outcome(codes: list[int | None], outcome: ExitCode, words: str) -> None:
    got, reason = decide_outcome(codes)
    assert got == outcome and words in reason


def test_parse_config(tmp_path: Path) -> None:
    cfg = parse_config(["--signal", "TERM", "--nprocs", "2", "--", "python", "t.py", "--x"], {"GANDIVA_STATE_DIR": "d"})
    assert cfg.command == ("python", "t.py", "--x") and cfg.signal == signal.SIGTERM and cfg.nprocs == 2
    assert cfg.state_dir == Path("d").absolute()
    cfg = parse_config(["--state-dir", str(tmp_path), "python"], {"GANDIVA_SIGNAL": "USR1"})
    assert cfg.signal == signal.SIGUSR1 and cfg.state_dir == tmp_path
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--", "x"], {}, "no state directory"),
        (["--state-dir", "d"], {}, "no command"),
        (["--state-dir", "d", "--signal", "NOPE", "--", "x"], {}, "unknown signal"),
        (["--state-dir", "d", "--nprocs", "two", "--", "x"], {}, "invalid int"),
        (["--state-dir", "d", "--progress-interval", "0", "--", "x"], {}, "positive"),
    ]
    for argv, env, msg in cases:
        with pytest.raises(UsageError, match=msg):
            parse_config(argv, env)
