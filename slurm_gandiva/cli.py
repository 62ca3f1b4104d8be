"""`gandiva` / `slurm-gandiva`: one entry point; each area registers its own sub-commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from slurm_gandiva.errors import GandivaError

# Each module has `register(subparsers) -> None`; handlers are set with `set_defaults(func=...)` and
# return an exit code. Modules import their heavy dependencies inside the handlers.
COMMAND_MODULES = (
    "slurm_gandiva.devcluster.cli",  # devcluster up|down|status
    "slurm_gandiva.requeue.cli",  # suspend, resume, migrate, resize
    "slurm_gandiva.controller.cli",  # controller, sbatch, squeue, cancel
    "slurm_gandiva.report.cli",  # sacct, report
    "slurm_gandiva.sim.cli",  # simulate
    "slurm_gandiva.topology.cli",  # topology probe|collect, gres-conf
    "slurm_gandiva.submit.cli",  # sbatch
    "slurm_gandiva.demo",  # demo (the README's main job)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gandiva", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that area is not installed in this build
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except GandivaError as exc:
        print(f"gandiva: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
