"""An in-memory Slurm that follows the held-requeue cycle, and a fake clock that drives it.

Only for the pure unit tests of the requeue protocol; the real behaviour is checked against a real Slurm
in tests/integration/test_requeue_cycle.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gandiva.errors import InvalidRequest, PermissionDenied, UnknownJob
from slurm_gandiva.model import Tenants
from slurm_gandiva.requeue.contract import read_park_request
from slurm_gandiva.slurm.accounting import UserAssociations
from slurm_gandiva.slurm.base import HoldKind, SlurmJob, SlurmNode, Snapshot, SubmitRequest
from slurm_gandiva.slurm.capabilities import SlurmCapabilities

SLURM_22_05 = SlurmCapabilities.for_release((22, 5, 8))
SLURM_24_11 = SlurmCapabilities.for_release((24, 11, 5))

Key = tuple[str, str]  # (gres name, type or "" when untyped)


def parse_gres(gres: str) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for part in filter(None, gres.split(",")):
        bits = part.split(":")
        key = (bits[0], bits[1] if len(bits) == 3 else "")
        out[key] = int(bits[-1])
    return out


def replace_gres(old: dict[Key, int], new: dict[Key, int], caps: SlurmCapabilities = SLURM_22_05) -> dict[Key, int]:
    """The CLI backend's gres update: a replacement (it clears Slurm 22.05's merge); ValueError where it refuses."""
    if caps.gres_kind_switch:
        return dict(new)
    old_kinds = {k[0] for k, n in old.items() if n > 0}
    new_kinds = {k[0] for k, n in new.items() if n > 0}
    if old_kinds and old_kinds != new_kinds:
        raise ValueError("Slurm cannot switch a job between whole GPUs and shards (gres)")
    if "shard" in old_kinds and not set(old) <= set(new):
        raise ValueError("Slurm 22.05 cannot take shards away from a job (gres)")
    return dict(new)


class FakeClock:
    """Monotonic seconds; `sleep` advances time and lets the fake Slurm move."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slurm: FakeSlurm | None = None

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += max(dt, 1e-3)
        if self.slurm is not None:
            self.slurm.tick()


@dataclass
class FakeJob:
    job_id: str
    user: str = "alice"
    state: str = "RUNNING"
    reason: str = "None"
    hold: HoldKind = HoldKind.NONE
    node: str = "n1"
    gpus: tuple[int, ...] = (0, 1)
    shared: bool = False
    restart_count: int = 0
    begin: float = 0.0
    asked: float = float("-inf")  # when a release or update last asked slurmctld for a scheduling pass
    end: float = 0.0  # when its last incarnation stopped (Slurm's EndTime)
    req_node: str = "n1"
    req_gres: str = "gpu:2"  # what Slurm shows as TresPerNode (the last update's text)
    req: dict[Key, int] = field(default_factory=dict)  # the request Slurm allocates from

    def __post_init__(self) -> None:
        self.req = parse_gres(self.req_gres)

    # What the "wrapper" does when signalled: "suspend", "ignore", "finish", "suspend-silent".
    on_signal: str = "suspend"
    react_after: float = 0.5
    signalled_at: float | None = None
    give_wrong_gpus: bool = False
    # What the "wrapper" does on the park signal: "obey" (handles the request in park-request.json), "ignore".
    on_park: str = "obey"
    park_signalled_at: float | None = None
    limit: str = ""  # a reason of Slurm's accounting ("QOSGrpGRES") that keeps it pending, whatever is free


@dataclass
class FakeSlurm:
    """Implements SlurmBackend over FakeJobs. `root=False` plays a non-admin caller."""

    clock: FakeClock
    jobs_root: Path | None = None
    root: bool = True
    gpus_per_node: int = 4
    jobs_: dict[str, FakeJob] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    released_at: dict[str, float] = field(default_factory=dict)  # job id -> clock at its last release
    lua_refuses: bool = False
    auto_tick: float = 0.0  # > 0: every job() call advances the fake clock (for code that sleeps for real)
    # slurmctld's passes read time() (the coarse clock): the pass in a begin time's own second skips the job,
    # and a job waiting for its begin time starts only in a pass asked for (release / update) after it.
    coarse_passes: bool = False
    log_reads: bool = False  # job() calls go into `calls` as ("job", id, "")
    hold_takes: float = 0.0  # seconds of the fake clock each hold() takes (a busy slurmctld)
    caps: SlurmCapabilities = SLURM_22_05

    def __post_init__(self) -> None:
        self.clock.slurm = self

    def capabilities(self) -> SlurmCapabilities:
        return self.caps

    # -- test helpers ------------------------------------------------------------------------------
    def add(self, job: FakeJob) -> FakeJob:
        self.jobs_[job.job_id] = job
        return job

    def called(self, method: str) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if c[0] == method]

    def write_status(self, job_id: str, outcome: str) -> None:
        if self.jobs_root is None:
            return
        d = self.jobs_root / job_id
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "status.json.tmp"
        tmp.write_text(json.dumps({"outcome": outcome, "t": self.clock.t}))
        os.replace(tmp, d / "status.json")
        if outcome == "suspended":
            (d / "checkpoint.pt").write_bytes(b"ckpt")

    def tick(self) -> None:
        now = self.clock.t
        for j in self.jobs_.values():
            if j.state == "RUNNING" and j.signalled_at is not None and now - j.signalled_at >= j.react_after:
                j.signalled_at = None
                if j.on_signal in ("suspend", "suspend-silent"):
                    if j.on_signal == "suspend":
                        self.write_status(j.job_id, "suspended")
                    self._requeue_hold(j)
                elif j.on_signal == "finish":
                    self.write_status(j.job_id, "done")
                    j.state, j.reason, j.gpus = "COMPLETED", "None", ()
            if j.state == "RUNNING" and j.park_signalled_at is not None and now - j.park_signalled_at >= j.react_after:
                j.park_signalled_at = None
                if j.on_park == "obey":
                    self._handle_park(j)
            if j.state == "PENDING" and j.hold is HoldKind.NONE:
                if now < j.begin or (self.coarse_passes and j.asked < j.begin):
                    j.reason = "BeginTime"
                    continue
                if j.limit:
                    j.reason = j.limit
                    continue
                busy = {
                    g
                    for o in self.jobs_.values()
                    if o is not j and o.state == "RUNNING" and set(o.node.split(",")) & set(j.req_node.split(","))
                    for g in o.gpus
                }
                untyped = j.req.get(("gpu", ""), 0)
                if untyped:  # Slurm picks the lowest free GPUs
                    free = [g for g in range(self.gpus_per_node) if g not in busy]
                    want = tuple(free[:untyped]) if len(free) >= untyped else ()
                else:
                    want = tuple(sorted(int(t[1:]) for (_, t) in j.req))
                if not want or busy & set(want):
                    j.reason = "Resources"
                    continue
                j.state, j.reason, j.node = "RUNNING", "None", j.req_node
                j.gpus = tuple(g + 1 for g in want) if j.give_wrong_gpus else want
                j.shared = any(n == "shard" for n, _ in j.req)

    def _handle_park(self, j: FakeJob) -> None:
        """As the wrapper: the root-owned request, then progress.json "parked" / "running" with its seq."""
        if self.jobs_root is None:
            return
        d = self.jobs_root / j.job_id
        req = read_park_request(d / "park-request.json", owner=os.geteuid(), job_id=j.job_id)
        if req is None:
            return
        state = "parked" if req.action == "park" else "running"
        prog = {"step": 10, "epoch": 0, "samples": 10, "total_samples": None, "batch_time_avg": 0.1,
                "samples_per_s": 10.0, "world_size": 1, "updated": self.clock.t, "state": state,
                "request_seq": req.seq, "parked_bytes": 1000 if state == "parked" else None}
        (d / "progress.json").write_text(json.dumps(prog))

    def _requeue_hold(self, j: FakeJob) -> None:
        j.state, j.reason, j.hold = "PENDING", "job_requeued_in_held_state", HoldKind.USER
        j.gpus, j.restart_count, j.begin = (), j.restart_count + 1, self.clock.t + 120.0
        j.end = float(int(self.clock.t))

    def _get(self, job_id: str) -> FakeJob:
        if job_id not in self.jobs_:
            raise UnknownJob(f"no job {job_id}")
        return self.jobs_[job_id]

    def _admin(self, what: str) -> None:
        if self.lua_refuses:
            raise InvalidRequest(f"{what}: Unspecified error")  # job_submit.lua refusing a non-root user
        if not self.root:
            raise PermissionDenied(f"{what}: Access/permission denied")

    # -- SlurmBackend ------------------------------------------------------------------------------
    def submit(self, req: SubmitRequest) -> str:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        return Snapshot(self.jobs(), self.nodes(), self.clock.t)

    def jobs(self) -> tuple[SlurmJob, ...]:
        return tuple(self.job(i) for i in self.jobs_)

    def job(self, job_id: str) -> SlurmJob:
        if self.auto_tick:
            self.clock.sleep(self.auto_tick)
        if self.log_reads:
            self.calls.append(("job", job_id, ""))
        j = self._get(job_id)
        running = j.state == "RUNNING"
        held = {n: j.gpus for n in j.node.split(",")} if running and j.gpus else {}  # per-node gres: same GPUs
        return SlurmJob(
            job_id=j.job_id,
            name="train",
            user=j.user,
            state=j.state,
            reason=j.reason,
            hold=j.hold,
            nodes=tuple((j.node if running else j.req_node).split(",")),
            gpus={} if j.shared else held,
            shards=held if j.shared else {},
            restart_count=j.restart_count,
            end_time=j.end,
            comment="gandiva",
            tres_per_node=j.req_gres,
        )

    def nodes(self) -> tuple[SlurmNode, ...]:
        gres = ",".join(f"gpu:g{k}:1" for k in range(self.gpus_per_node))
        gres += "," + ",".join(f"shard:g{k}:2" for k in range(self.gpus_per_node))
        return tuple(SlurmNode(n, "IDLE", ("debug",), gres, "") for n in ("n1", "n2"))

    def signal(self, job_id: str, signal_name: str, *, batch_only: bool = True) -> None:
        self.calls.append(("signal", job_id, signal_name))
        j = self._get(job_id)
        if j.state != "RUNNING":
            raise InvalidRequest(f"job {job_id} is not running")
        if signal_name.upper().removeprefix("SIG") == "URG":  # the park signal: the request file says what to do
            j.park_signalled_at = self.clock.t
            return
        if signal_name.upper().removeprefix("SIG") in ("STOP", "CONT"):  # a parked job frozen and thawed
            return
        j.signalled_at = self.clock.t

    def requeue_hold(self, job_id: str) -> None:
        self.calls.append(("requeue_hold", job_id, ""))
        j = self._get(job_id)
        if j.state != "RUNNING":
            raise InvalidRequest(f"job {job_id} is not running")
        self._requeue_hold(j)

    def hold(self, job_id: str) -> None:
        self.calls.append(("hold", job_id, ""))
        self._admin("hold")
        if self.hold_takes:
            self.clock.sleep(self.hold_takes)
        j = self._get(job_id)
        if j.state == "PENDING":
            j.hold, j.reason = HoldKind.ADMIN, "JobHeldAdmin"

    def release(self, job_id: str) -> None:
        self.calls.append(("release", job_id, ""))
        self._admin("release")
        j = self._get(job_id)
        self.released_at[job_id] = self.clock.t
        j.hold, j.reason, j.asked = HoldKind.NONE, "None", self.clock.t

    def update(self, job_id: str, **fields: str) -> None:
        self.calls.append(("update", job_id, " ".join(f"{k}={v}" for k, v in sorted(fields.items()))))
        self._admin("update")
        j = self._get(job_id)
        if j.state != "PENDING":
            raise InvalidRequest(f"job {job_id}: Job is no longer pending execution")
        j.asked = self.clock.t
        if "gres" in fields:
            try:
                j.req = replace_gres(j.req, parse_gres(fields["gres"]), self.caps)
            except ValueError as exc:
                raise InvalidRequest(f"{exc} for job {job_id}") from None
            j.req_gres = fields["gres"]
        if "nodelist" in fields:
            j.req_node = fields["nodelist"]
        if fields.get("starttime", "").startswith("now"):  # now[+N]: N whole seconds from Slurm's second
            later = fields["starttime"][4:]
            j.begin = float(int(self.clock.t) + int(later or 0)) if later else self.clock.t

    def cancel(self, job_id: str, *, as_user: str | None = None) -> None:
        self._get(job_id).state = "CANCELLED"

    def tenants(self) -> Tenants:
        return Tenants()

    def user_associations(self, user: str) -> UserAssociations | None:
        return None
