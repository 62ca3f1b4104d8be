"""The one interface to Slurm. Backends (CLI with --json; optional pyslurm) implement `SlurmBackend`."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from slurm_gandiva.model import Tenants
    from slurm_gandiva.slurm.accounting import UserAssociations
    from slurm_gandiva.slurm.capabilities import SlurmCapabilities


class HoldKind(enum.Enum):
    NONE = "none"
    USER = "user"  # the owner can release it (JobHeldUser, requeue-hold)
    ADMIN = "admin"  # only root / SlurmUser can release it (JobHeldAdmin)


# Reasons (job_reason_string) besides the Assoc* and QOS* limits that only an accounting change lifts.
_ACCOUNTING_REASONS = ("AccountNotAllowed", "InvalidAccount", "InvalidQOS")


@dataclass(frozen=True)
class SlurmJob:
    """A job as Slurm reports it, in the project's own terms (parsed in slurm/ only)."""

    job_id: str
    name: str
    user: str
    state: str  # Slurm's base state, upper case: PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...
    reason: str  # state_reason, e.g. "JobHeldAdmin", "job_requeued_in_held_state", "BeginTime", "None"
    hold: HoldKind
    nodes: tuple[str, ...]  # allocated nodes (running), else the requested node list if any
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> GPU indices held
    shards: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> GPU indices held as shards
    restart_count: int = 0
    comment: str = ""
    partition: str = ""
    submit_time: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0
    exit_code: int | None = None
    tres_per_node: str = ""
    work_dir: str = ""
    std_out: str = ""
    array_id: str = ""  # the job array's id when this is one of its tasks (job_id is then "ARRAY_TASK")
    array_max_tasks: int = 0  # the array's %MAX throttle: at most this many of its tasks run at once; 0: none
    min_cpus_per_node: int = 0  # CPUs each of its nodes must give it (MinCPUsNode); 0: unknown
    min_memory_per_node: int = 0  # MB each of its nodes must give it (MinMemoryNode, or per CPU x CPUs); 0: none
    account: str = ""  # the Slurm account it runs under ("" where accounting is off)
    qos: str = ""  # its QOS ("" where accounting is off)

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def accounting_limited(self) -> bool:
        """Pending because Slurm's accounting holds it back (a QOS or association limit, or its account or QOS
        not allowed): it starts only once usage or the limits change, wherever its GPUs are free."""
        return self.pending and (self.reason.startswith(("Assoc", "QOS")) or self.reason in _ACCOUNTING_REASONS)

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING", "CONFIGURING")

    @property
    def finished(self) -> bool:
        return self.state in (
            "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED",
        )


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # IDLE, MIXED, ALLOCATED, DOWN, DRAIN, ...
    partitions: tuple[str, ...]
    gres: str  # configured, e.g. "gpu:g0:1,gpu:g1:1,...,shard:g0:2,..."
    gres_used: str
    cpus: int = 0
    sockets: int = 0
    memory: int = 0  # RealMemory, MB; 0: unknown
    alloc_cpus: int = 0  # CPUs allocated to jobs now
    alloc_memory: int = 0  # MB allocated to jobs now (0 where memory is not a consumable resource)

    @property
    def up(self) -> bool:
        s = self.state.upper()
        return not any(x in s for x in ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "UNKNOWN", "INVAL"))


@dataclass(frozen=True)
class SubmitRequest:
    """An sbatch call. `options` are extra sbatch options (already split; never passed through a shell)."""

    script: str  # the batch script's text (given to sbatch on stdin)
    options: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    as_user: str | None = None  # run sbatch as this user (root only); None: the caller


@dataclass(frozen=True)
class Snapshot:
    """One consistent look at Slurm: every job and node, from one squeue and one sinfo call."""

    jobs: tuple[SlurmJob, ...]
    nodes: tuple[SlurmNode, ...]
    taken_at: float


class SlurmBackend(Protocol):
    """What the rest of the project may ask of Slurm. Every call raises slurm_gandiva.errors.SlurmError
    subclasses (SlurmUnreachable, PermissionDenied, UnknownJob, InvalidRequest) on failure."""

    def capabilities(self) -> SlurmCapabilities:
        """What the running Slurm can do (learned once, then cached): see slurm/capabilities.py."""

    def submit(self, req: SubmitRequest) -> str:
        """sbatch --parsable, always with --requeue and --open-mode=append; returns the job id."""

    def snapshot(self) -> Snapshot:
        """All jobs and nodes (one squeue --json and one sinfo --json call)."""

    def jobs(self) -> tuple[SlurmJob, ...]: ...

    def job(self, job_id: str) -> SlurmJob:
        """One job (raises UnknownJob); on 22.05 this still reads every job, so prefer snapshot()."""

    def nodes(self) -> tuple[SlurmNode, ...]: ...

    def signal(self, job_id: str, signal_name: str, *, batch_only: bool = True) -> None:
        """scancel --signal=SIG [--batch | --full] JOB."""

    def requeue_hold(self, job_id: str) -> None:
        """scontrol requeuehold JOB."""

    def hold(self, job_id: str) -> None:
        """scontrol hold JOB (an admin hold when the caller is root / SlurmUser)."""

    def release(self, job_id: str) -> None:
        """scontrol release JOB."""

    def update(self, job_id: str, **fields: str) -> None:
        """scontrol update jobid=JOB k=v ... (e.g. nodelist=n2, gres=gpu:g0:1,gpu:g1:1, starttime=now)."""

    def cancel(self, job_id: str, *, as_user: str | None = None) -> None:
        """scancel JOB."""

    def tenants(self) -> Tenants:
        """The accounts' and users' shares and the association and QOS GPU limits, from slurmdbd (sacctmgr
        and sshare); raises AccountingUnavailable when slurmdbd cannot be reached or accounting is off."""

    def user_associations(self, user: str) -> UserAssociations | None:
        """`user`'s accounts (its default among them) and each one's QOS, from slurmdbd; None where the
        cluster has no accounting; raises AccountingUnavailable when slurmdbd cannot be reached."""
