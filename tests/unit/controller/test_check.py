"""`gandiva controller --check` validates everything the start would (policy, its parameters' types and
ranges, partitions, topology file, database), one line per refusal; a SIGHUP reload validates the same
way and keeps the running config when the new one is bad."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gandiva.cli import main
from slurm_gandiva.config import parse_config
from slurm_gandiva.controller.service import Controller, check_config
from slurm_gandiva.errors import ConfigError
from slurm_gandiva.model import Topology
from slurm_gandiva.store import Store
from slurm_gandiva.topology.file import write_topology
from tests.unit.controller.controller_fakes import FakeBackend

TOPO = Topology.uniform(2, 4, gpus_per_switch=2, sockets=2)


def conf(tmp_path: Path, extra: str = "") -> str:
    topo = tmp_path / "topology.json"
    if not topo.exists():
        write_topology(TOPO, topo)
    return f"state_dir = {tmp_path / 'state'}\ntopology_file = {topo}\npartitions = gpu\n{extra}"


def refusal(tmp_path: Path, extra: str) -> str:
    with pytest.raises(ConfigError) as ei:
        check_config(parse_config(conf(tmp_path, extra)), FakeBackend([]))
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def test_a_good_config_passes(tmp_path: Path) -> None:
    checked = check_config(parse_config(conf(tmp_path, "policy.min_slice = 30\n")), FakeBackend([]))
    assert checked.policy.name == "gandiva" and checked.topology == TOPO
    assert "will be created" in checked.database


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("policy.min_slice = abc\n", "policy parameter min_slice = 'abc' must be a number"),
        ("policy.min_slice = -5\n", "min_slice = -5 must not be negative"),
        ("policy.quantum = 0\n", "quantum = 0 must be positive"),
        ("policy.pack = 1\n", "pack = 1 must be true or false"),
        ("policy.max_moves = 2.5\n", "max_moves = 2.5 must be a whole number"),
        ("policy.pack_keep = 3\n", "pack_keep = 3 must be a fraction"),
        ("policy.bogus = 1\n", "policy 'gandiva' has no parameter bogus"),
        ("policy = nope\n", "unknown policy 'nope'"),
        ("partitions = gpu, nope\n", "partition 'nope' does not exist in Slurm (it has gpu)"),
        ("database_url = postgresql://u@127.0.0.1:1/db\n", "cannot open database"),
    ],
)
def test_refusals_are_one_line(tmp_path: Path, extra: str, needle: str) -> None:
    text = conf(tmp_path, extra)
    if extra.startswith("partitions"):
        text = text.replace("partitions = gpu\n", "")
    with pytest.raises(ConfigError) as ei:
        check_config(parse_config(text), FakeBackend([]))
    assert needle in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("content", [b"\x00\xff\xfe\x81 binary", b"{not json", b"[1, 2]", b'{"nodes": 5}'])
def test_a_garbage_topology_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "topology.json").write_bytes(content)
    msg = refusal(tmp_path, "")
    assert "topology file" in msg and "regenerate it" in msg


def test_a_database_of_a_newer_gandiva_is_refused(tmp_path: Path) -> None:
    import sqlalchemy as sa

    (tmp_path / "state").mkdir()
    db = tmp_path / "state" / "gandiva.db"
    Store(f"sqlite:///{db}").close()
    assert "answers" in check_config(parse_config(conf(tmp_path)), FakeBackend([])).database
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.begin() as conn:
        conn.execute(sa.text("UPDATE schema_version SET version = 999"))
    eng.dispose()
    assert "newer than this gandiva's" in refusal(tmp_path, "")


def test_controller_check_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("slurm_gandiva.slurm.make_backend", lambda env=None, **_kw: FakeBackend([]))
    f = tmp_path / "gandiva.conf"
    f.write_text(conf(tmp_path))
    assert main(["controller", "--check", "--config", str(f)]) == 0
    assert ": ok (policy gandiva" in capsys.readouterr().out
    f.write_text(conf(tmp_path, "policy.min_slice = abc\n"))
    assert main(["controller", "--check", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "min_slice = 'abc' must be a number" in err and err.count("\n") == 1
    f.write_text(conf(tmp_path, "signal = KILL\n"))
    assert main(["controller", "--check", "--config", str(f)]) == 2
    assert "KILL cannot suspend a job" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra", ["policy.min_slice = abc\n", "partitions = nope\n", "policy = nope\n", "database_url = sqlite:////x/y.db\n"]
)
def test_reload_validates_the_same_way_and_keeps_the_running_config(tmp_path: Path, extra: str) -> None:
    f = tmp_path / "gandiva.conf"
    f.write_text(conf(tmp_path))
    cfg = parse_config(f.read_text(), source=str(f))
    (tmp_path / "state").mkdir()
    store = Store(cfg.db_url)
    ctl = Controller(cfg, FakeBackend([]), store, config_path=f, progress_reader=lambda _p, _u: None)
    running = (ctl.config, ctl.policy)
    f.write_text(conf(tmp_path, extra).replace("partitions = gpu\n", "") if "partitions" in extra
                 else conf(tmp_path, extra))
    assert ctl.reload() is False
    assert (ctl.config, ctl.policy) == running
    [e] = store.events(kinds=["config-reload-refused"])
    assert "\n" not in e.detail
    f.write_text(conf(tmp_path, "policy.min_slice = 45\n"))
    assert ctl.reload() is True and ctl.policy.min_slice == 45.0  # type: ignore[attr-defined]


def test_check_says_what_to_do_with_the_old_shared_spec_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("slurm_gandiva.slurm.make_backend", lambda env=None, **_kw: FakeBackend([]))
    f = tmp_path / "gandiva.conf"
    f.write_text(conf(tmp_path))
    cfg = parse_config(conf(tmp_path))
    cfg.job_root.mkdir(parents=True, exist_ok=True)
    assert main(["controller", "--check", "--config", str(f)]) == 0
    assert "old shared spec directory" not in capsys.readouterr().out
    (cfg.job_root / "spec").mkdir()
    assert main(["controller", "--check", "--config", str(f)]) == 0  # a warning: old jobs still read it
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "old shared spec directory" in x]
    assert f"rm -r {cfg.job_root / 'spec'}" in line
