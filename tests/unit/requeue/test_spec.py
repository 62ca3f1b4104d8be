import os
from pathlib import Path

import pytest

from slurm_gandiva.requeue.spec import (
    SubmitSpec,
    fallback_spec,
    read_spec,
    spec_from_script,
    spec_path,
    write_spec,
)


def _spec(**kw: object) -> SubmitSpec:
    base: dict[str, object] = dict(
        job_id="42",
        user="alice",
        min_gpus=1,
        max_gpus=4,
        model="cifar10",
        total_samples=1280,
        name="train.py",
        partition="gpu",
        signal="USR2",
        submitted=100.5,
        command=("python", "train.py", "--lr", "0.1"),
    )
    base.update(kw)
    return SubmitSpec(**base)  # type: ignore[arg-type]


def test_json_round_trip_keeps_every_field() -> None:
    s = _spec()
    assert SubmitSpec.from_json(s.to_json()) == s
    assert "\n" not in _spec(command=("echo", "a\nb")).to_json()


def test_to_job_spec_carries_range_and_work() -> None:
    js = _spec().to_job_spec()
    assert (js.min_gpus, js.max_gpus, js.total_work, js.model, js.user) == (1, 4, 1280.0, "cifar10", "alice")
    assert js.elastic and js.submit_time == 100.5
    assert _spec(total_samples=None).to_job_spec(7.0).total_work is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"version": 2}',
        '{"version": 1, "job_id": "1"}',
        '{"version":1,"job_id":"1","user":"a","min_gpus":3,"max_gpus":2}',
        '{"version":1,"job_id":"1","user":"a","min_gpus":"1","max_gpus":2}',
    ],
)
def test_malformed_json_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        SubmitSpec.from_json(text)


def test_write_then_read(tmp_path: Path) -> None:
    s = _spec()
    p = write_spec(tmp_path, s)
    assert p == spec_path(tmp_path, "42")
    assert oct((tmp_path / "spec").stat().st_mode & 0o7777) == oct(0o1777)
    assert read_spec(tmp_path, "42") == s
    assert read_spec(tmp_path, "42", owner="alice") == s  # written by root here: root-owned is trusted
    assert read_spec(tmp_path, "43") is None
    assert list((tmp_path / "spec").iterdir()) == [p]  # no temp files left behind


def test_read_refuses_other_users_and_mismatches(tmp_path: Path) -> None:
    write_spec(tmp_path, _spec())
    assert read_spec(tmp_path, "42", owner="bob") is None  # names alice
    # a file planted by another user for this job id is ignored
    p = spec_path(tmp_path, "42")
    os.chown(p, 54321, 54321)
    assert read_spec(tmp_path, "42", owner="alice") is None
    # a file whose content names another job
    write_spec(tmp_path, _spec(job_id="7"))
    os.replace(spec_path(tmp_path, "7"), spec_path(tmp_path, "8"))
    assert read_spec(tmp_path, "8") is None
    spec_path(tmp_path, "9").write_text("garbage")
    assert read_spec(tmp_path, "9") is None


def test_bad_job_ids_never_become_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        spec_path(tmp_path, "../etc/passwd")
    assert read_spec(tmp_path, "../x") is None


def test_spec_from_script_and_fallback() -> None:
    s = _spec(job_id="")
    script = f"#!/bin/bash\n# gandiva-spec: {s.to_json()}\nexec true\n"
    assert spec_from_script(script) == s
    assert spec_from_script("#!/bin/bash\n") is None
    fb = fallback_spec("5", "bob", 2)
    assert (fb.min_gpus, fb.max_gpus, fb.elastic) == (2, 2, False)
