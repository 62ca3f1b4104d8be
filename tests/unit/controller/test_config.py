"""Config parsing, line-precise errors and the privilege check."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from slurm_gandiva.config import check_privilege, load_config, parse_config, slurm_user
from slurm_gandiva.errors import ConfigError, PermissionDenied

REPO = Path(__file__).resolve().parents[3]


def test_example_config_in_etc_is_valid() -> None:
    cfg = load_config(REPO / "etc" / "gandiva.conf")
    assert cfg.policy == "gandiva"
    assert cfg.quantum == 60 and cfg.tick == 5
    assert cfg.partitions == ("gpu",)
    assert cfg.metrics_port == 9464
    assert cfg.job_root == Path("/shared/gandiva/jobs")


def test_parses_keys_sections_and_policy_params() -> None:
    text = """
# comment
state_dir = /tmp/st
quantum = 20   # inline comment
tick = 2
partitions = gpu, debug
signal = SIGALRM
policy = afs-l
policy.lease = 7200
[policy]
seed = 3
packing = yes
"""
    cfg = parse_config(text)
    assert cfg.state_dir == Path("/tmp/st")
    assert cfg.quantum == 20.0 and cfg.tick == 2.0
    assert cfg.partitions == ("gpu", "debug")
    assert cfg.signal == "ALRM"
    assert cfg.params == {"lease": 7200, "seed": 3, "packing": True}
    assert cfg.db_url == "sqlite:////tmp/st/gandiva.db"
    assert cfg.job_root == Path("/tmp/st/jobs")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tick = 5\n\nquantum = -3\n", "gandiva.conf:3: quantum must be a positive number of seconds"),
        ("quantum = soon\n", "gandiva.conf:1: quantum must be a positive number of seconds"),
        ("# x\nbogus = 1\n", "gandiva.conf:2: unknown key 'bogus'"),
        ("signal = SIGNOPE\n", "gandiva.conf:1: signal = SIGNOPE: unknown signal 'SIGNOPE'"),
        ("signal = KILL\n", "gandiva.conf:1: signal = KILL: signal KILL cannot suspend a job: cannot be caught"),
        ("signal = 19\n", "gandiva.conf:1: signal = 19: signal STOP cannot suspend a job: cannot be caught"),
        ("signal = usr1\n", "gandiva.conf:1: signal = usr1: signal USR1 cannot suspend a job: NCCL installs"),
        ("metrics_port = 70000\n", "gandiva.conf:1: metrics_port must be a port number"),
        ("tick = 1\ntick = 2\n", "gandiva.conf:2: tick is already set on line 1"),
        ("just words\n", "gandiva.conf:1: expected 'key = value'"),
        ("[nope]\n", "gandiva.conf:1: unknown section [nope]"),
        ("quantum = 10\ntick = 30\n", "gandiva.conf:2: tick (30 s) must not be longer than quantum (10 s)"),
        ("database_url = /not/a/url\n", "gandiva.conf:1: database_url must be a SQLAlchemy URL"),
        ("max_nodes = 0\n", "gandiva.conf:1: max_nodes must be a whole number of nodes, at least 1, or `any`"),
        ("max_registrations = 0\n", "gandiva.conf:1: max_registrations must be a whole number of jobs, at least 1"),
        ("max_registrations = lots\n", "gandiva.conf:1: max_registrations must be a whole number of jobs"),
    ],
)
def test_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gandiva.conf")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_max_nodes_defaults_to_any() -> None:
    assert parse_config("", "x").max_nodes is None and parse_config("max_nodes = any\n", "x").max_nodes is None
    assert parse_config("max_nodes = 2\n", "x").max_nodes == 2


def test_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "absent.conf")


def test_privilege_root_allowed_other_refused(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmUser=slurm # the daemon user\n")
    cfg = parse_config(f"slurm_conf = {conf}\n")
    assert slurm_user(conf) == "slurm"
    assert check_privilege(cfg, euid=0) == "root"
    nobody = pwd.getpwnam("nobody").pw_uid
    with pytest.raises(PermissionDenied, match=r"cannot place admin holds.*SlurmUser 'slurm'"):
        check_privilege(cfg, euid=nobody)


def test_privilege_slurm_user_allowed(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmUser=nobody\n")
    cfg = parse_config(f"slurm_conf = {conf}\n")
    assert check_privilege(cfg, euid=pwd.getpwnam("nobody").pw_uid) == "nobody"


def test_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "g.conf"
    f.write_text("quantum = 15\ntick = 1\n")
    monkeypatch.setenv("GANDIVA_CONF", str(f))
    cfg = load_config()
    assert cfg.quantum == 15 and cfg.source == str(f)
    assert os.environ["GANDIVA_CONF"] == str(f)
