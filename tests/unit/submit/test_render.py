"""The rendered script, run by a real bash with a fake wrapper: every value arrives verbatim, nothing runs."""

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from slurm_gandiva.requeue.spec import SubmitSpec, spec_from_script
from slurm_gandiva.submit.render import render_script, signal_name

NASTY = (
    "python3",
    "train.py",
    'it\'s a "quoted" arg',
    "spaces   inside",
    "$(touch {pwned})",
    "`touch {pwned}`",
    "; touch {pwned};",
    "a && touch {pwned} || b",
    "$HOME ${{PATH}} $SLURM_JOB_ID",
    "line1\nline2",
    "*",
    "--",
    "",
    "\\",
    "'",
    "#not-a-comment",
)


def _fake_wrapper(tmp: Path) -> Path:
    w = tmp / "bin dir" / "fake-wrapper"
    w.parent.mkdir()
    w.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "out = {'argv': sys.argv[1:], 'state': os.environ.get('GANDIVA_STATE_DIR'),\n"
        "       'signal': os.environ.get('GANDIVA_SIGNAL')}\n"
        "open(os.environ['OUT_FILE'], 'w').write(json.dumps(out))\n"
    )
    w.chmod(w.stat().st_mode | stat.S_IXUSR)
    return w


def test_values_arrive_verbatim_and_nothing_is_executed(tmp_path: Path) -> None:
    pwned = tmp_path / "PWNED"
    command = tuple(a.format(pwned=pwned) for a in NASTY)
    spec = SubmitSpec(
        job_id="",
        user="u",
        min_gpus=1,
        max_gpus=2,
        model="m'; touch x",
        command=command,
        signal="USR2",
        name="$(touch n)",
    )
    jobs_root = tmp_path / f"jobs $(touch {pwned}) root"
    jobs_root.mkdir(parents=True)  # the admin's jobs root exists; the script makes only the job's directory
    wrapper = _fake_wrapper(tmp_path)
    script = render_script(spec, str(jobs_root), wrapper=str(wrapper), wrapper_args=("--nprocs", "2 3"))
    assert script.startswith("#!/bin/bash\n")
    out = tmp_path / "out.json"
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1234", "OUT_FILE": str(out)}
    script_path = tmp_path / "job.sh"
    script_path.write_text(script)
    subprocess.run(["bash", str(script_path)], env=env, check=True, cwd=tmp_path, timeout=30)
    got = json.loads(out.read_text())
    assert got["argv"] == ["--signal", "USR2", "--nprocs", "2 3", "--", *command]
    assert got["state"] == f"{jobs_root}/1234"
    assert got["signal"] == "USR2"
    assert Path(got["state"]).is_dir()
    assert stat.S_IMODE(Path(got["state"]).stat().st_mode) == 0o700  # the user's alone
    assert not pwned.exists()
    assert not (tmp_path / "x").exists() and not (tmp_path / "n").exists()
    # the embedded spec reads back exactly
    assert spec_from_script(script) == spec


def test_script_ends_with_exec_of_the_wrapper() -> None:
    spec = SubmitSpec(job_id="", user="u", min_gpus=1, max_gpus=1, command=("python", "t.py"))
    last = render_script(spec, "/j", wrapper="gandiva-wrapper").rstrip("\n").splitlines()[-1]
    assert last == "exec gandiva-wrapper --signal USR2 -- python t.py"


@pytest.mark.parametrize("raw,name", [("SIGUSR2", "USR2"), ("alrm", "ALRM"), ("14", "ALRM")])
def test_signal_names(raw: str, name: str) -> None:
    assert signal_name(raw) == name


def test_unknown_signal_is_a_config_error() -> None:
    from slurm_gandiva.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown signal"):
        signal_name("NOPE")
    for refused, why in (("KILL", "cannot be caught"), ("SIGSTOP", "cannot be caught"), ("usr1", "NCCL")):
        with pytest.raises(ConfigError, match=why):
            signal_name(refused)


def test_the_signal_is_ignored_until_the_wrapper_catches_it(tmp_path: Path) -> None:
    """A suspend signal that comes before the wrapper has its handler must not kill the job's shell (the
    job would end FAILED): the script ignores it, and the wrapper it execs starts with it ignored."""
    spec = SubmitSpec(job_id="", user="u", min_gpus=1, max_gpus=1, command=("python", "t.py"), signal="USR2")
    wrapper = tmp_path / "wrapper"
    wrapper.write_text("#!/bin/bash\nkill -USR2 $$\necho alive > \"$OUT_FILE\"\n")
    wrapper.chmod(0o755)
    (tmp_path / "jobs").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(render_script(spec, str(tmp_path / "jobs"), wrapper=str(wrapper)))
    out = tmp_path / "out"
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "OUT_FILE": str(out)}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, timeout=30, check=False)
    assert proc.returncode == 0 and out.read_text() == "alive\n"
