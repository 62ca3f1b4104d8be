"""`gandiva-wrapper [options] -- CMD ...`: the entry point the job script `exec`s."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from job_wrapper.launcher import UsageError, WrapperConfig, run
from slurm_gandiva.requeue.contract import (
    SIGNAL_ENV,
    STATE_DIR_ENV,
    ExitCode,
    StateDirError,
    signal_from_name,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gandiva-wrapper",
        description="Run a training command as one process per allocated GPU; on the suspend signal the "
        "training stops at a mini-batch boundary, checkpoints, and the job goes into a held requeue.",
    )
    p.add_argument("--signal", default=None,
                   help=f"suspend signal name (default: ${SIGNAL_ENV} or USR2; never USR1, NCCL owns it)")
    p.add_argument("--state-dir", default=None, help=f"the job's state directory (default: ${STATE_DIR_ENV})")
    p.add_argument("--nprocs", type=int, default=None,
                   help="training processes (default: one per GPU in CUDA_VISIBLE_DEVICES / SLURM_*_GPUS, else 1)")
    p.add_argument("--progress-interval", type=float, default=5.0, metavar="S",
                   help="seconds between progress.json updates (default 5)")
    p.add_argument("--grace", type=float, default=60.0, metavar="S",
                   help="seconds the other ranks get after one exits, before they are killed (default 60)")
    # Internal: the batch wrapper of a job on several nodes starts one launcher per node with it (via srun).
    p.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def parse_config(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> WrapperConfig:
    """Parse the command line; raises UsageError with a one-line message."""
    env = dict(os.environ) if env is None else env
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given: use gandiva-wrapper [options] -- CMD ...")
    state_dir = args.state_dir or env.get(STATE_DIR_ENV)
    if not state_dir:
        raise UsageError(f"no state directory: pass --state-dir or set {STATE_DIR_ENV}")
    try:
        sig = signal_from_name(args.signal or env.get(SIGNAL_ENV))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.progress_interval <= 0:
        raise UsageError("--progress-interval must be positive")
    return WrapperConfig(
        command=tuple(command),
        state_dir=Path(state_dir).absolute(),
        signal=sig,
        nprocs=args.nprocs,
        progress_interval=args.progress_interval,
        grace_s=args.grace,
        node=args.node,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        code = run(config)
        # From here on there is nothing to stop: ignore the signal, or it would kill this process (the batch
        # shell) during interpreter teardown, where Python restores the default action, and fail the job.
        signal.signal(config.signal, signal.SIG_IGN)
        return code
    except UsageError as exc:
        print(f"gandiva-wrapper: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except StateDirError as exc:  # nothing was run and nothing written there
        print(f"gandiva-wrapper: {exc}; the job does not run", file=sys.stderr)
        return int(ExitCode.FAILED)
    except OSError as exc:  # e.g. the state directory became unwritable or full while the job ran
        where = f" {exc.filename}" if exc.filename else ""
        print(f"gandiva-wrapper: cannot write{where}: {exc.strerror or exc}; check the job's state directory",
              file=sys.stderr)
        return int(ExitCode.FAILED)


if __name__ == "__main__":
    sys.exit(main())
