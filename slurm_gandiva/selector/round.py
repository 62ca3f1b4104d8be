"""One scheduling round: the policy's plan and every rule the live round applies to it after.

    out = run_round(policy, view, RoundInputs(finishing=..., backoff=..., members=...))
    out.plan                                     # what to carry out

The controller (`Controller._tick`) and the simulator (`sim/engine.py`) both call `run_round`, so a rule
added here holds in both. Pure: the time is the view's `now`, the inputs are plain data, and what a rule
dropped is in the outcome for the caller to log. The rules, in this order:

1. Finishing jobs are spared (`spare_finishing`): no stop of a job whose wrapper reports training over
   (it is only exiting: stopping it gains nothing and a signal could fail a finished run), nor the
   decisions that counted on its GPUs; but only for a bounded time (`spared_until`): a claim is the
   job's own word, so from the first round that saw it, at most one quantum, and no longer than its
   measured finish plus `FINISH_MARGIN_S`. A job still there after that is stopped like any other.
2. Group caps (`throttle_groups`): no start or resume that would run more jobs of a capped group (a job
   array's %MAX) than its cap, as the cluster counts its running members (Slurm also counts a task it
   still tears down); the plan's suspends free places first, then the members with the least attained
   service (then the longest waiting) take the places left.
3. Back-off (`without_backoff`): no move (anything but a suspend) of a job whose last move failed, until
   its back-off ends; retrying at once would only stop and restart it again for nothing. A waiting job
   that holds no GPUs is not even shown to the policy meanwhile (`hide_backed_off`), so its GPUs go to
   others rather than being kept for a start that is then dropped. The back-off grows with the job's
   failures in a row (`backoff_delay`: doubling, capped).
4. GPU limits (`limit_gpus`): no start, resume or growth that would make the jobs of one `GpuLimit` scope
   (an association's or QOS's `GrpTRES=gres/gpu=N`, or per user its `MaxTRESPerUser`; `ClusterView.tenants`)
   hold more than its GPUs, counted as group caps are (the view's running jobs; the plan's suspends and
   shrinks free first; the least served take first). A waiting job that asks more than a limit over it
   allows can never start: it is not shown to the policy (its GPUs go to others) and the outcome names it
   with why (`over_limit`), for the caller to tell its user.
5. Co-held switch (`selector.cohold.co_held`): only where the view allows co-held placements
   (`ClusterView.co_hold`, off in the live controller's view), a switch between two jobs on the same GPUs
   becomes a park and an unpark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from slurm_gandiva.model import ClusterView, GpuLimit, GpuRef, Job, JobState
from slurm_gandiva.plan import Action, Plan
from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.cohold import co_held

_TAKES = (Action.START, Action.RESUME)
# How long a job may take to exit after its last sample (final checkpoint, process teardown) and still be
# spared: a claim of being done buys this much, never more than a quantum.
FINISH_MARGIN_S = 30.0


class Claim(NamedTuple):
    """A job's claim that it is finishing: when a round first saw it, and when the job's measured rate
    says it is done (at `since` or before for a job that says it is done)."""

    since: float
    eta: float


def spared_until(claim: Claim, quantum: float) -> float:
    """Until when a job that claims to be finishing is spared: `claim.since` plus the time to its measured
    finish and `FINISH_MARGIN_S`, at most one `quantum`. The controller's observer (which then stops
    believing the claim) and the round apply this same bound."""
    return claim.since + min(quantum, max(0.0, claim.eta - claim.since) + FINISH_MARGIN_S)


class Member(NamedTuple):
    """A job of a capped group: its group, the group's cap, and whether it counts as running now."""

    group: str
    cap: int
    running: bool


@dataclass(frozen=True)
class RoundInputs:
    """What the round's rules read besides the view.

    `finishing`: job id -> its `Claim`, for the jobs whose progress report says training is over; each is
    spared until `spared_until(claim, quantum)`. `backoff`: job id -> until when its failed moves are not
    retried (entries at or before the view's `now` are spent). `members`: the jobs of capped groups
    (job id -> `Member`), as the cluster counts them; None: from the view (`group_members`). `quantum`:
    the time-slice, the longest a claim spares a job."""

    finishing: Mapping[str, Claim] = field(default_factory=dict)
    backoff: Mapping[str, float] = field(default_factory=dict)
    members: Mapping[str, Member] | None = None
    quantum: float = 60.0


@dataclass(frozen=True)
class RoundOutcome:
    """The plan to carry out, the policy's own plan, and the jobs each rule kept from it."""

    plan: Plan
    decided: Plan
    spared: tuple[str, ...] = ()  # finishing jobs the plan stopped
    throttled: tuple[str, ...] = ()  # jobs not placed: their group runs its cap
    held_back: tuple[str, ...] = ()  # jobs whose moves wait for their back-off
    overdue: tuple[str, ...] = ()  # jobs claiming to finish past their bound (`spared_until`): not spared
    limited: tuple[str, ...] = ()  # jobs not placed: a GPU limit over them is reached
    over_limit: Mapping[str, str] = field(default_factory=dict)  # job id -> why no limit lets it ever start


def run_round(policy: Policy, view: ClusterView, inputs: RoundInputs | None = None) -> RoundOutcome:
    """`policy.decide(view, view.now)` with the round's rules applied (see the module docstring)."""
    inputs = inputs or RoundInputs()
    shown, over_limit = hide_over_limit(hide_backed_off(view, inputs.backoff))
    decided = policy.decide(shown, view.now)
    standing, overdue = standing_claims(inputs.finishing, inputs.quantum, view.now)
    plan, spared = spare_finishing(decided, view, standing)
    members = inputs.members if inputs.members is not None else group_members(view)
    plan, throttled = throttle_groups(plan, view, members)
    plan, held = without_backoff(plan, inputs.backoff, view.now)
    plan, limited = limit_gpus(plan, view)
    plan = co_held(plan, view)
    return RoundOutcome(plan, decided, spared, throttled, held, overdue, limited, over_limit)


def standing_claims(claims: Mapping[str, Claim], quantum: float, now: float) -> tuple[frozenset[str], tuple[str, ...]]:
    """The jobs whose claim still spares them at `now` (`spared_until`), and those past their bound."""
    standing = frozenset(jid for jid, c in claims.items() if now < spared_until(c, quantum))
    return standing, tuple(sorted(claims.keys() - standing))


def spare_finishing(plan: Plan, view: ClusterView, finishing: Collection[str]) -> tuple[Plan, tuple[str, ...]]:
    """`plan` without stops of finishing jobs, nor the decisions that counted on their GPUs; and the
    finishing jobs it stopped."""
    if not finishing:
        return plan, ()
    spared = {d.job_id for d in plan.decisions if d.action not in _TAKES and d.job_id in finishing}
    if not spared:
        return plan, ()
    busy: set[GpuRef] = set()
    for jid in spared:
        p = view.job(jid).placement
        if p is not None:
            busy.update(p.gpus)
    keep = tuple(
        d for d in plan.decisions
        if d.job_id not in spared and not (d.placement is not None and busy.intersection(d.placement.gpus))
    )
    return Plan(keep), tuple(sorted(spared))


def group_members(view: ClusterView) -> dict[str, Member]:
    """The view's jobs of capped groups (`ClusterView.group_caps`), running while the view says so."""
    caps = view.group_caps
    if not caps:
        return {}
    return {
        j.job_id: Member(g, caps[g], j.state is JobState.RUNNING)
        for j in view.jobs
        if (g := j.spec.group) is not None and g in caps
    }


def throttle_groups(plan: Plan, view: ClusterView, members: Mapping[str, Member]) -> tuple[Plan, tuple[str, ...]]:
    """`plan` without the starts and resumes that would run more members of a group than its cap; and
    the jobs dropped."""
    if not members or not plan:
        return plan, ()
    running: Counter[str] = Counter(m.group for m in members.values() if m.running)
    for d in plan.decisions:
        m = members.get(d.job_id)
        if d.action is Action.SUSPEND and m is not None and m.running:
            running[m.group] -= 1
    order = {j.job_id: i for i, j in enumerate(view.jobs)}  # the view lists jobs by submit time, then id

    def rank(job_id: str) -> tuple[float, int]:
        served = view.job(job_id).attained_service if job_id in order else 0.0
        return (served, order.get(job_id, len(order)))

    takes = sorted((d.job_id for d in plan.decisions if d.action in _TAKES and d.job_id in members), key=rank)
    dropped: set[str] = set()
    for jid in takes:
        group, cap, _ = members[jid]
        if running[group] < cap:
            running[group] += 1
        else:
            dropped.add(jid)
    if not dropped:
        return plan, ()
    return Plan(tuple(d for d in plan.decisions if d.job_id not in dropped)), tuple(sorted(dropped))


def without_backoff(plan: Plan, backoff: Mapping[str, float], now: float) -> tuple[Plan, tuple[str, ...]]:
    """`plan` without the moves (not suspends) of jobs whose back-off lasts past `now`; and those jobs."""
    if not backoff:
        return plan, ()
    waiting = {jid for jid, until in backoff.items() if until > now}
    if not waiting:
        return plan, ()
    keep = tuple(d for d in plan.decisions if d.action is Action.SUSPEND or d.job_id not in waiting)
    if len(keep) == len(plan.decisions):
        return plan, ()
    held = sorted({d.job_id for d in plan.decisions if d.action is not Action.SUSPEND and d.job_id in waiting})
    return Plan(keep), tuple(held)


BACKOFF_DOUBLINGS = 4  # a job's back-off grows to at most 2**4 = 16 quanta


def backoff_delay(failures: int, quantum: float) -> float:
    """How long a job's moves wait after its `failures`-th failed move in a row: one quantum, doubling with
    each further failure, at most 2**BACKOFF_DOUBLINGS quanta."""
    return quantum * float(2 ** min(max(failures, 1) - 1, BACKOFF_DOUBLINGS))


def hide_backed_off(view: ClusterView, backoff: Mapping[str, float]) -> ClusterView:
    """`view` without the jobs that hold no GPUs and wait for their back-off past the view's `now`."""
    waiting = {jid for jid, until in backoff.items() if until > view.now}
    if not waiting:
        return view
    jobs = tuple(j for j in view.jobs if not (j.job_id in waiting and j.placement is None))
    return view if len(jobs) == len(view.jobs) else replace(view, jobs=jobs)


def _limits(view: ClusterView) -> tuple[GpuLimit, ...]:
    return view.tenants.limits if view.tenants is not None else ()


def limit_refusal(limit: GpuLimit, job: Job) -> str:
    """Why `job` can never start under `limit` (it covers the job and allows fewer GPUs than its minimum);
    "" when it can."""
    if limit.scope(job.spec) is None or job.spec.min_gpus <= limit.gpus:
        return ""
    if limit.qos:
        who = f"QOS {limit.qos}"
    elif limit.user:
        who = f"the association of user {limit.user} in account {limit.account}"
    else:
        who = f"account {limit.account}"
    each = " per user" if limit.per_user else ""
    unit = "GPU" if limit.gpus == 1 else "GPUs"
    return f"{who} allows {limit.gpus} {unit}{each}, the job asks {job.spec.min_gpus}"


def hide_over_limit(view: ClusterView) -> tuple[ClusterView, dict[str, str]]:
    """`view` without the waiting jobs that no GPU limit over them would ever let start; and those jobs,
    each with why (`limit_refusal`)."""
    limits = _limits(view)
    if not limits:
        return view, {}
    why: dict[str, str] = {}
    for j in view.jobs:
        if j.state.waiting and j.placement is None:
            for lim in limits:
                if reason := limit_refusal(lim, j):
                    why[j.job_id] = reason
                    break
    if not why:
        return view, {}
    return replace(view, jobs=tuple(j for j in view.jobs if j.job_id not in why)), why


def limit_gpus(plan: Plan, view: ClusterView) -> tuple[Plan, tuple[str, ...]]:
    """`plan` without the starts, resumes and growths that would make a GPU limit's scope hold more GPUs
    than it allows; and the jobs dropped. The view's running jobs count; the plan's suspends and shrinks
    free first; then the least-served jobs (then the longest waiting) take what is left."""
    limits = _limits(view)
    if not limits or not plan:
        return plan, ()
    held: Counter[tuple[int, tuple[str, ...]]] = Counter()

    def scopes(job: Job) -> list[tuple[int, tuple[str, ...]]]:
        return [(i, s) for i, lim in enumerate(limits) if (s := lim.scope(job.spec)) is not None]

    for j in view.running:
        for key in scopes(j):
            held[key] += j.gpus
    order = {j.job_id: i for i, j in enumerate(view.jobs)}
    wants: list[tuple[Job, int]] = []
    for d in plan.decisions:
        if d.job_id not in order:
            continue
        j = view.job(d.job_id)
        new = 0 if d.action is Action.SUSPEND or d.placement is None else d.placement.count
        delta = new - (j.gpus if j.state is JobState.RUNNING else 0)
        if delta < 0:
            for key in scopes(j):
                held[key] += delta
        elif delta > 0:
            wants.append((j, delta))
    wants.sort(key=lambda w: (w[0].attained_service, order[w[0].job_id]))
    dropped: set[str] = set()
    for j, n in wants:
        keys = scopes(j)
        if all(held[k] + n <= limits[k[0]].gpus for k in keys):
            for k in keys:
                held[k] += n
        else:
            dropped.add(j.job_id)
    if not dropped:
        return plan, ()
    return Plan(tuple(d for d in plan.decisions if d.job_id not in dropped)), tuple(sorted(dropped))
