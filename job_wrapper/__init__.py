"""The job side of slurm-gandiva: `gandiva-wrapper` (launcher) and the training-loop API (`Session`).

`import job_wrapper` is cheap: the torch-using API is imported on first use of one of its names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from job_wrapper.api import (
        Session,
        exit_process,
        init_distributed,
        ordered_allreduce,
        rank_and_world_size,
    )
    from job_wrapper.checkpoint import CheckpointError
    from job_wrapper.data import ResumableSampler, SeededDataset
    from job_wrapper.order import epoch_order

__all__ = ["CheckpointError", "ResumableSampler", "SeededDataset", "Session", "epoch_order", "exit_process",
           "init_distributed", "ordered_allreduce", "rank_and_world_size"]

_LAZY = {
    "Session": "job_wrapper.api",
    "epoch_order": "job_wrapper.order",
    "exit_process": "job_wrapper.api",
    "init_distributed": "job_wrapper.api",
    "ordered_allreduce": "job_wrapper.api",
    "rank_and_world_size": "job_wrapper.api",
    "CheckpointError": "job_wrapper.checkpoint",
    "ResumableSampler": "job_wrapper.data",
    "SeededDataset": "job_wrapper.data",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'job_wrapper' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
