"""Render the batch script of a managed job from templates/job.sh.j2 (jinja2).

Every user-supplied value reaches the script through the `q` filter (shlex.quote); the spec line is JSON,
which has no raw newline, inside a shell comment.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm_gandiva.errors import ConfigError
from slurm_gandiva.requeue.contract import JOB_SUBMITTED_ENV, SIGNAL_ENV, STATE_DIR_ENV, suspend_signal
from slurm_gandiva.requeue.spec import SCRIPT_MARKER, SubmitSpec

TEMPLATE = "job.sh.j2"
WRAPPER = "gandiva-wrapper"


def template_dirs() -> tuple[Path, ...]:
    """Where job.sh.j2 may live: the repository's templates/ (editable install), then the package's."""
    pkg = Path(__file__).resolve().parent.parent
    return (pkg.parent / "templates", pkg / "templates")


def wrapper_path() -> str:
    """gandiva-wrapper next to this Python (so jobs find it without the venv on PATH), else by name."""
    here = Path(sys.executable).parent / WRAPPER
    return str(here) if here.exists() else WRAPPER


def signal_name(sig: str) -> str:
    """Normalise a signal name ("SIGUSR2", "usr2", "12") to Slurm's form ("USR2"); ConfigError for one a job
    cannot be suspended with (see contract.REFUSED_SIGNALS)."""
    try:
        return suspend_signal(sig).name.removeprefix("SIG")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def render_script(
    spec: SubmitSpec,
    jobs_root: str,
    *,
    wrapper: str | None = None,
    wrapper_args: Sequence[str] = (),
) -> str:
    """The batch script's text: exports the job's state dir, signal and identity (its submit time, which
    each checkpoint records), then execs the wrapper on the command."""
    import jinja2

    if not spec.command:
        raise ValueError("the spec has no command")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in template_dirs()]),
        autoescape=False,  # noqa: S701 - a shell script, not HTML; values go through `q`
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    try:
        template = env.get_template(TEMPLATE)
    except jinja2.TemplateNotFound:
        raise ConfigError(
            f"template {TEMPLATE} not found in {', '.join(map(str, template_dirs()))}: reinstall slurm-gandiva"
        ) from None
    return template.render(
        spec_marker=SCRIPT_MARKER,
        spec_json=spec.to_json(),
        state_dir_env=STATE_DIR_ENV,
        signal_env=SIGNAL_ENV,
        submitted_env=JOB_SUBMITTED_ENV,
        submitted=f"{spec.submitted:.6f}",
        jobs_root=jobs_root.rstrip("/") or "/",
        signal=spec.signal,
        wrapper=wrapper or wrapper_path(),
        wrapper_args=list(wrapper_args),
        command=list(spec.command),
    )
