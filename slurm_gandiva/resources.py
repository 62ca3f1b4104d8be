"""Finds the project's templates/ directory and renders jinja2 templates from it.

Looked up in order: $GANDIVA_TEMPLATES, the package's own `slurm_gandiva/templates` (an installed
wheel), the repository's top-level `templates/` (a source checkout or an editable install), and
`<prefix>/share/slurm-gandiva/templates`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_gandiva.errors import ConfigError

TEMPLATES_ENV = "GANDIVA_TEMPLATES"


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    out: list[Path] = []
    env = os.environ.get(TEMPLATES_ENV)
    if env:
        out.append(Path(env))
    out += [here / "templates", here.parent / "templates", Path(sys.prefix) / "share" / "slurm-gandiva" / "templates"]
    return out


def templates_dir() -> Path:
    """The directory holding slurm.conf.j2, job_submit.lua, ...; ConfigError when none is found."""
    for cand in _candidates():
        if (cand / "slurm.conf.j2").is_file():
            return cand
    tried = ", ".join(str(c) for c in _candidates())
    raise ConfigError(f"templates/ not found (tried {tried}): set {TEMPLATES_ENV} to the project's templates dir")


def template_path(name: str) -> Path:
    """Path of one file in templates/ (ConfigError when missing)."""
    p = templates_dir() / name
    if not p.is_file():
        raise ConfigError(f"template {name} missing from {p.parent}: reinstall slurm-gandiva")
    return p


def render(name: str, context: Mapping[str, Any]) -> str:
    """Render templates/<name> with jinja2 (StrictUndefined: a missing variable is an error)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - config files, not HTML
    )
    return env.get_template(name).render(**context)
