"""A fair-share layer over any policy: tenants' GPUs split by their shares, the inner policy decides within.

    policy = FairShare(make_policy("gandiva"), shares={"physics": 2, "bio": 1}, half_life=7 * 86400)

Tenants are Slurm's association tree cut at two levels: the account (`JobSpec.account`), then the user in
it. Each round, among the tenants with active jobs only (work-conserving: an idle tenant's share goes to
the others at once), the up GPUs are water-filled by share: an account gets GPUs in proportion to its
share (`shares`, 1 when not named) up to what its jobs can use (the sum of their `max_gpus`), what it
cannot use goes to the others; within an account its users split its GPUs the same way, by their own
shares (equally when none are named). The shares are the view's (`ClusterView.tenants`, read from Slurm's
accounting by the controller) when it has them, else the ones given here. Whole
GPUs are handed out by stride order (Gandiva-fair, EuroSys'20: pass = attained GPU-seconds / tickets,
lowest first), with the attained GPU-seconds decayed by a half-life as Slurm's `PriorityDecayHalfLife`
decays usage (priority_multifactor.c; Fair Tree ranks accounts, then users in them, the same way).
So the decayed usage decides the rounding and who gives GPUs back first; the split itself is by shares.

A tenant holds the GPUs its running jobs hold (`gpus_held`): a GPU its own packed jobs share counts once,
as on its share alone, one it shares with another tenant's job counts to both.

The inner policy first decides on the whole cluster, as without the layer (with `steer_grows`, told each
tenant's cap: `ClusterView.tenant_caps`, and an elastic policy, AFS's rule, hands spare GPUs to the jobs of
tenants below their caps first, and to the others only what those cannot use); its plan stands unless it
leaves a tenant short of its cap by enough GPUs for one of its waiting jobs, or packs a job onto a shard
of another tenant's GPU past its own tenant's cap (`packs_past_cap`: with every tenant at its cap none is
short, and such packs gave one tenant's jobs shards of the others' GPUs round after round). So the layer is
work-conserving (GPUs a tenant's jobs cannot use or be placed on, and those a tenant at its cap could use
while no one is short, stay busy) and the inner policy's global order (default's shortest-first) is kept
while every tenant gets its share.
Measured on bench_fairness.py (b): the per-tenant decisions alone left 2,200 GPU-hours idle while jobs
waited and cost 32% average JCT; with this check first no GPU idles while a job waits.

Otherwise the inner policy decides on a view that keeps each tenant within its GPUs (its `cap`):
- When a tenant below its cap has waiting jobs, tenants above theirs give GPUs back: the layer suspends
  their most-served running jobs (hidden from the inner policy, so their GPUs look free), so that the
  free GPUs go to the under-served tenant within this round (one rotation).
- A tenant at or above its cap with waiting jobs, or (under a policy that preempts) with a waiting job
  wider than what it lacks of its cap, is decided alone, on a view with only its jobs and the GPUs they
  hold (`only_gpus`): the inner policy rotates its jobs within its share as it would on that share alone
  (measured under gandiva at 500 jobs a VC: without the second case a tenant whose small time-sliced jobs
  kept it a few GPUs below its cap could not start a 16-GPU job for 11 h, and the worst rho was 3.30
  instead of 0.96). The other tenants are decided together, on their GPUs and the free ones. A placement on
  a GPU whose shards two such groups hold is dropped (neither saw the other's shard), and with it what was
  placed where its job then stays (a migrate onto such a GPU dropped alone double-booked its old GPU).
  Where Slurm ties a requeued job to its old GPU indices (`ClusterView.requeue_ties`, 22.05), a start or
  resume on a node where another group's job that stays holds one of them is dropped too (`tied_elsewhere`:
  its group's placement could not see that GPU held, and Slurm would leave it pending).
- A job of a tenant at its cap may not grow (its `max_gpus` is its current count in the view).
- No tenant is taken below its cap, or below what it holds when that is less, for another tenant's job
  (`keep_floors`): the inner policy rotates a group's jobs as one pool, in its own order, not the shares'.
- The inner plans' starts, resumes and grows past a tenant's cap are dropped (its own suspends free
  places first; the least-served jobs keep theirs), and a suspend whose GPUs no kept decision uses is
  dropped too, so no tenant loses a GPU to a start that was dropped.
- The groups are then decided again without the jobs whose starts or resumes were dropped (up to
  `_PASSES` times), so that the GPUs the inner policy gave them go to other jobs instead of idling; the
  pass that keeps the most starts and resumes stands.

Not done here: a catch-up beyond the share for a tenant that was under-served long. The GPU limits of
associations and QOS (`Tenants.limits`) are a rule of the round (selector/round.py), as array caps are.

The decayed usage is the one state carried between rounds, explicitly: `TenantUsage`, which `decide`
updates from the view (each job's `attained_service` since the last round; a job that finished between
two rounds loses its last round's service). Pure otherwise: time is the view's `now`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobState, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector.base import Policy

FAIRNESS_MODES = ("none", "shares")
DEFAULT_HALF_LIFE_S = 7 * 86400.0  # Slurm's PriorityDecayHalfLife default: 7-0
_TAKES = (Action.START, Action.RESUME)
_PASSES = 3  # inner decisions per group and round at most: again without the takes dropped past a cap

Tenant = tuple[str, str]  # (account, user)


def tenant_of(job: Job) -> Tenant:
    return (job.spec.account, job.spec.user)


@dataclass
class TenantUsage:
    """Decayed attained GPU-seconds per tenant, and what the last round saw (the state carried between
    rounds; the controller may persist it)."""

    usage: dict[Tenant, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # job id -> attained_service at the last round
    at: float | None = None

    def update(self, view: ClusterView, half_life: float) -> None:
        """Decay to `view.now` and add each job's service since the last round."""
        if self.at is not None and view.now > self.at and math.isfinite(half_life):
            k = 0.5 ** ((view.now - self.at) / half_life)
            self.usage = {t: u * k for t, u in self.usage.items()}
        self.at = view.now if self.at is None else max(self.at, view.now)
        seen: dict[str, float] = {}
        before, usage = self.seen, self.usage
        for j in view.jobs:
            served = j.attained_service
            if served <= 0:  # never served (most of a long queue): nothing to add or remember
                continue
            delta = served - before.get(j.job_id, 0.0)
            if delta > 0:
                t = (j.spec.account, j.spec.user)
                usage[t] = usage.get(t, 0.0) + delta
            seen[j.job_id] = served
        self.seen = seen


def water_fill(total: int, demand: Mapping[str, int], weight: Mapping[str, float], order: list[str]) -> dict[str, int]:
    """`total` whole units split in proportion to `weight`, none above its `demand`; what one cannot use
    goes to the others; the units left by rounding go one each in `order` (first: most entitled). A weight
    of 0 (Slurm's Fairshare=0) gets only what those with a weight cannot use, split equally among such."""
    out = {k: 0 for k in demand}
    left = total
    open_ = [k for k in order if demand[k] > 0 and weight[k] > 0]
    if not open_:  # none with a weight wants any: the weightless split what there is equally
        weight = {k: 1.0 for k in demand}
        open_ = [k for k in order if demand[k] > 0]
    while left > 0 and open_:
        w = sum(weight[k] for k in open_)
        give = {k: min(demand[k] - out[k], math.floor(left * weight[k] / w)) for k in open_}
        if not any(give.values()):
            for k in open_:  # rounding: one each, by order
                if left == 0:
                    break
                out[k] += 1
                left -= 1
        else:
            for k, g in give.items():
                out[k] += g
                left -= g
        open_ = [k for k in open_ if out[k] < demand[k]]
    rest = {k: demand[k] - out[k] for k in demand if weight[k] <= 0 and demand[k] > out[k]}
    if left > 0 and rest:
        more = water_fill(left, rest, {k: 1.0 for k in rest}, [k for k in order if k in rest])
        return {k: out[k] + more.get(k, 0) for k in out}
    return out


def tenant_demand(view: ClusterView) -> Counter[Tenant]:
    """The GPUs each tenant's active jobs could use: their `max_gpus`, but no more than the GPU limits over
    them (`Tenants.limits`) allow, so that what a limited tenant cannot hold goes to the others."""
    demand: Counter[Tenant] = Counter()
    limits = view.tenants.limits if view.tenants is not None else ()
    if not limits:  # one pass, no scopes: the round's hot path at 10,000 jobs
        plain: dict[Tenant, int] = {}
        for j in view.jobs:
            if not j.state.finished:
                spec = j.spec
                t = (spec.account, spec.user)
                plain[t] = plain.get(t, 0) + spec.max_gpus
        demand.update(plain)
        return demand
    room: dict[tuple[int, tuple[str, ...]], int] = {}
    keys_of: dict[tuple[str, str, str], list[tuple[int, tuple[str, ...]]]] = {}  # a limit's scope reads these
    for j in view.jobs:
        spec = j.spec
        if j.state.finished:
            continue
        want = spec.max_gpus
        sig = (spec.account, spec.user, spec.qos)
        keys = keys_of.get(sig)
        if keys is None:
            keys = keys_of[sig] = [(i, sc) for i, lim in enumerate(limits) if (sc := lim.scope(spec)) is not None]
        for k in keys:
            want = min(want, room.setdefault(k, limits[k[0]].gpus))
        for k in keys:
            room[k] -= want
        demand[(spec.account, spec.user)] += want
    return demand


@dataclass
class FairShare:
    """`inner` with tenants kept to their shares (see the module docstring). `shares`: account -> its
    share (1 when not named); users in an account share it equally. `half_life`: seconds (inf: no decay)."""

    inner: Policy
    shares: Mapping[str, float] = field(default_factory=dict)
    half_life: float = DEFAULT_HALF_LIFE_S
    state: TenantUsage = field(default_factory=TenantUsage)
    entitled: tuple[float, dict[Tenant, int]] | None = field(default=None, repr=False)  # (now, the last round's caps)
    steer_grows: bool = False  # hand spare GPUs to the jobs of tenants below their caps first (see `decide`)

    def __post_init__(self) -> None:
        bad = [a for a, s in self.shares.items() if not (isinstance(s, (int, float)) and s > 0 and math.isfinite(s))]
        if bad:
            raise ValueError(f"share of account {bad[0]!r} must be a positive number, not {self.shares[bad[0]]!r}")
        if not self.half_life > 0:
            raise ValueError(f"half_life {self.half_life} must be a positive number of seconds")

    @property
    def name(self) -> str:
        return self.inner.name

    def __getattr__(self, attr: str) -> Any:
        # quantum, elastic, rotation_grid, next_decision, seed: the inner policy's. An own field not set yet
        # (a copy or unpickle before __init__) is missing, not looked up in `inner` (which would recurse).
        if attr in self.__dataclass_fields__:
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def caps(self, view: ClusterView, held: Counter[Tenant] | None = None) -> dict[Tenant, int]:
        """Each tenant with active jobs -> the GPUs it may hold this round (`held`: `gpus_held` of the view's
        running jobs, when the caller has it).

        The GPUs left by rounding go in stride order, a tenant's decayed usage less one quantum of
        GPU-time per GPU it holds now: a tenant keeps a GPU it holds until it has used a quantum more
        than the next in line (Gandiva-fair's passes move once a quantum). Without that credit the
        order flips within a tick or two as the holder's usage grows, and each flip is a suspend and
        a start (measured: one of each every 5-15 s with four tenants on 8 GPUs)."""
        demand = tenant_demand(view)
        usage = self.state.usage
        credit = float(getattr(self.inner, "quantum", None) or 0.0)
        if credit > 0:
            if held is None:
                held = gpus_held(view.running)
            usage = {t: usage.get(t, 0.0) - credit * held[t] for t in set(usage) | set(held)}

        def stride(key: tuple[float, float]) -> float:
            return key[0] / key[1] if key[1] > 0 else math.inf  # a share of 0 comes last

        accounts = sorted({a for a, _ in demand})
        acct_demand = {a: sum(d for (aa, _), d in demand.items() if aa == a) for a in accounts}
        shares = view.tenants.shares if view.tenants is not None else self.shares
        user_shares = view.tenants.user_shares if view.tenants is not None else {}
        acct_share = {a: float(shares.get(a, 1.0)) for a in accounts}
        acct_use = {a: sum(u for (aa, _), u in usage.items() if aa == a) for a in accounts}
        order = sorted(accounts, key=lambda a: (stride((acct_use[a], acct_share[a])), a))
        total = len(view.topology.all_gpus())
        per_acct = water_fill(total, acct_demand, acct_share, order)
        out: dict[Tenant, int] = {}
        for a in accounts:
            users = sorted(u for aa, u in demand if aa == a)
            weight = {u: float(user_shares.get((a, u), 1.0)) for u in users}
            u_order = sorted(users, key=lambda u: (weight[u] <= 0, usage.get((a, u), 0.0), u))
            got = water_fill(per_acct[a], {u: demand[(a, u)] for u in users}, weight, u_order)
            out.update({(a, u): g for u, g in got.items()})
        return out

    def decide(self, view: ClusterView, now: float) -> Plan:
        self.state.update(view, self.half_life)
        held = gpus_held(view.running)
        caps = self.caps(view, held)
        self.entitled = (view.now, caps)
        if len(caps) < 2:  # one tenant with active jobs (or none): nothing to share
            return self.inner.decide(view, now)
        # `steer_grows`: an elastic inner policy grows the jobs of tenants below their caps first
        # (`tenant_caps`), so that a tenant whose jobs all run (none waits, so none is short below) is not
        # kept narrow while other tenants' jobs grow (a 2869ce job at 4 GPUs for 118 h that had 12 alone on
        # its 64, before the grow guard). Off by default: since the grow guard it costs 10-12% average JCT on
        # Philly (b) at 500 jobs a VC (benchmarks/results/fairness_500.txt).
        if self.steer_grows:
            view = replace(view, tenant_caps=caps)
        # Work-conserving first: the inner policy's own plan on the whole cluster stands (its global
        # order kept across tenants) unless it leaves a tenant short of its cap by a waiting job, or packs
        # a job onto another tenant's GPU past its own tenant's cap.
        plan = self.inner.decide(view, now)
        after_plan = plan.apply(view) if plan.decisions else view
        if not self._starves(after_plan, caps) and not packs_past_cap(plan, after_plan, caps):
            return plan
        widest: dict[Tenant, int] = {}  # tenant with waiting jobs -> its widest waiting job's min_gpus
        for j in view.waiting:
            t = tenant_of(j)
            widest[t] = max(widest.get(t, 0), j.spec.min_gpus)
        waiting = set(widest)
        unmet = sum(max(0, caps[t] - held[t]) for t in waiting)
        released = self._release(view, caps, held, unmet - len(view.free_gpus()) if unmet else 0)
        after = Counter(held)
        for j in released:
            after[tenant_of(j)] -= j.gpus
        gone = {j.job_id for j in released}
        # A tenant at or above its cap with waiting jobs decides alone on the GPUs it holds, so that the
        # inner policy rotates its jobs within its share as it would on that share alone; the others
        # decide together on their GPUs and the free ones.
        # A tenant with a waiting job wider than what it lacks of its cap decides alone too, where its
        # policy preempts: in the shared group the job's start would pass its cap and be dropped, round
        # after round (its small time-sliced jobs keep it a few GPUs below its cap), where alone its policy
        # stops its own jobs for it. A policy that never preempts (`preempts = False`: slurm, fifo) would
        # leave the job waiting alone for its own jobs to end (Philly 4 VCs x 500, load 1.5, slurm with
        # fairshare and the layer: 282 h average JCT against 147 h without this case).
        preempts = getattr(self.inner, "preempts", True)
        apart = {
            t for t in waiting if after[t] >= caps.get(t, 0) or (preempts and after[t] + widest[t] > caps.get(t, 0))
        }
        groups: dict[Tenant | None, list[Job]] = {}
        for j in view.jobs:
            t = tenant_of(j)
            if j.job_id in gone:
                continue
            if j.state is JobState.RUNNING and after[t] >= caps.get(t, 0) and j.spec.max_gpus > j.gpus:
                j = j.evolve(spec=replace(j.spec, max_gpus=max(j.spec.min_gpus, j.gpus)))
            groups.setdefault(t if t in apart else None, []).append(j)
        holders: dict[GpuRef, set[Tenant | None]] = {}
        for key, jobs in groups.items():
            for j in jobs:
                for g in j.placement.gpus if j.state is JobState.RUNNING and j.placement else ():
                    holders.setdefault(g, set()).add(key)
        topologies: dict[Tenant | None, Topology] = {}
        for key in groups:
            if key is not None or apart:
                gpus = {g for g, keys in holders.items() if key in keys}
                if key is None:
                    # a released job's GPUs are free unless a job that stays holds a shard of them
                    gone_gpus = {g for j in released if j.placement for g in j.placement.gpus}
                    gpus |= set(view.free_gpus()) | (gone_gpus - holders.keys())
                topologies[key] = only_gpus(view.topology, gpus)
        # a GPU whose shards two groups hold: neither group sees the other's shard, so neither places there
        contested = {g for g, keys in holders.items() if len(keys) > 1}
        inner_view = replace(view, jobs=tuple(j for jobs in groups.values() for j in jobs))
        group_of = {j.job_id: key for key, jobs in groups.items() for j in jobs}
        hidden: set[str] = set()
        best: tuple[int, Plan] | None = None
        for _ in range(_PASSES):
            decisions: list[Decision] = []
            for key, jobs in groups.items():
                shown = tuple(j for j in jobs if j.job_id not in hidden)
                sub = replace(view, topology=topologies.get(key, view.topology), jobs=shown)
                decisions += self.inner.decide(sub, now).decisions
            if contested:
                # transitively: a job whose move is dropped stays, and so do the jobs placed where it was
                for d in [d for d in decisions if d.placement and contested.intersection(d.placement.gpus)]:
                    decisions = _without(decisions, inner_view, d)
            tied: set[str] = set()
            if apart and view.requeue_ties:  # a group's sub-view hides the GPUs the others hold from its ties
                tied = {d.job_id for d in tied_elsewhere(decisions, inner_view, group_of)}
                decisions = [d for d in decisions if d.job_id not in tied or d.action not in _TAKES]
            decisions = keep_floors(decisions, inner_view, caps, after)
            plan = keep_to_caps(Plan(tuple(decisions)), inner_view, caps, after)
            # A start or resume dropped past its tenant's cap leaves the GPUs the inner policy gave it idle
            # (it placed the others around it): decide again without it, so that they go to another job.
            # The pass that keeps the most takes stands (a later one may keep fewer).
            takes = sum(1 for d in plan.decisions if d.action in _TAKES)
            if best is None or takes > best[0]:
                best = (takes, plan)
            kept = {id(d) for d in plan.decisions}
            dropped = {d.job_id for d in decisions if d.action in _TAKES and id(d) not in kept} | tied
            if not dropped - hidden:
                break
            hidden |= dropped
        assert best is not None
        plan = best[1]
        own = tuple(Decision(Action.SUSPEND, j.job_id, reason="fair share: tenant above its share") for j in released)
        return Plan(own + plan.decisions)

    @staticmethod
    def _starves(after: ClusterView, caps: Mapping[Tenant, int]) -> bool:
        """Whether, in `after`, a tenant is short of its cap by enough GPUs for one of its waiting jobs (a
        shortfall none of them fits in could not be used without passing its cap)."""
        smallest: dict[Tenant, int] = {}
        running: list[Job] = []
        queued, suspended = JobState.QUEUED, JobState.SUSPENDED
        for j in after.jobs:  # one pass (10,000 jobs a round live)
            state = j.state
            if state is JobState.RUNNING:
                running.append(j)
            elif state is queued or state is suspended:
                spec = j.spec
                t = (spec.account, spec.user)
                k = smallest.get(t)
                if k is None or spec.min_gpus < k:
                    smallest[t] = spec.min_gpus
        held = gpus_held(running)
        return any(held[t] + k <= caps.get(t, 0) for t, k in smallest.items())

    def _release(self, view: ClusterView, caps: Mapping[Tenant, int], held: Counter[Tenant], need: int) -> list[Job]:
        """Running jobs of tenants above their caps to suspend for `need` GPUs: the tenant furthest above
        first, its most-served job first."""
        out: list[Job] = []
        over = Counter({t: held[t] - caps.get(t, 0) for t in held if held[t] > caps.get(t, 0)})
        if need <= 0 or not over:
            return out
        by_tenant: dict[Tenant, list[Job]] = {}
        for j in view.running:
            by_tenant.setdefault(tenant_of(j), []).append(j)
        for jobs in by_tenant.values():
            jobs.sort(key=lambda j: (-j.attained_service, j.job_id))
        while need > 0:
            cands = [t for t, n in over.items() if n > 0 and by_tenant.get(t)]
            if not cands:
                break
            t = max(cands, key=lambda t: (over[t], t))
            j = by_tenant[t].pop(0)
            out.append(j)
            over[t] -= j.gpus
            need -= j.gpus
        return out


def gpus_held(running: Iterable[Job]) -> Counter[Tenant]:
    """The GPUs each tenant's `running` jobs hold: a GPU its packed jobs share counts once (as Gandiva
    alone on a tenant's share packs onto it), one that another tenant's job shares counts to both."""
    held: Counter[Tenant] = Counter()
    shared: dict[Tenant, set[GpuRef]] = {}
    for j in running:
        p = j.placement
        if p is None:
            continue
        spec = j.spec
        if p.shared:
            shared.setdefault((spec.account, spec.user), set()).update(p.gpus)
        else:
            held[(spec.account, spec.user)] += p.count
    for t, gpus in shared.items():
        held[t] += len(gpus)
    return held


def packs_past_cap(plan: Plan, after: ClusterView, caps: Mapping[Tenant, int]) -> bool:
    """Whether `plan` packs a job onto a shard of a GPU another tenant's job holds, its tenant ending past
    its cap in `after` (the view after `plan`). With every tenant at its cap none is short, yet such packs
    let one tenant's jobs take shards of the others' GPUs round after round (4 tenants 4:2:1:1 on 8 GPUs
    under gandiva: the big one got 64% of the GPU-time for its 50% share)."""
    packs = [d for d in plan.decisions if d.placement is not None and d.placement.shared]
    if not packs:
        return False
    holders: dict[GpuRef, set[Tenant]] = {}
    for j in after.running:
        for g in j.placement.gpus if j.placement is not None else ():
            holders.setdefault(g, set()).add(tenant_of(j))
    held = gpus_held(after.running)
    for d in packs:
        t = tenant_of(after.job(d.job_id))
        if held[t] > caps.get(t, 0) and d.placement and any(holders[g] - {t} for g in d.placement.gpus):
            return True
    return False


def tied_elsewhere(
    decisions: list[Decision], view: ClusterView, group_of: Mapping[str, Tenant | None]
) -> list[Decision]:
    """The starts and resumes a Slurm that ties requeued jobs (`ClusterView.requeue_ties`) would leave
    pending: the job is placed on a node where a running job of another group, which `decisions` leave
    there, holds a GPU with one of the job's old indices (`Job.requeue_indices`). Each group was decided on
    a view of its own GPUs (`only_gpus`), so its placement could not see that GPU held; the actor skips
    such a resume too (its `_tie_conflicts`), but the GPUs it was given would then idle for the round."""
    takes = [d for d in decisions if d.action in _TAKES and d.placement is not None]
    if not any(view.job(d.job_id).requeue_indices for d in takes):
        return []
    changed = {d.job_id: d.placement for d in decisions if d.action not in _TAKES}
    held: dict[GpuRef, Tenant | None] = {}
    for j in view.running:
        if j.placement is None:
            continue
        gpus = set(j.placement.gpus)
        if j.job_id in changed:  # suspended: frees them; moved or resized: keeps those it stays on
            p = changed[j.job_id]
            gpus &= set(p.gpus) if p is not None else set()
        held.update((g, group_of.get(j.job_id)) for g in gpus)
    out = []
    for d in takes:
        tied = view.job(d.job_id).requeue_indices
        nodes = set(d.placement.nodes) if d.placement is not None else set()
        key = group_of.get(d.job_id)
        if tied and any(g.node in nodes and g.index in tied and k != key for g, k in held.items()):
            out.append(d)
    return out


def only_gpus(topology: Topology, gpus: set[GpuRef]) -> Topology:
    """`topology` with only `gpus` (the rest look held by jobs outside the view); nodes left without GPUs go."""
    nodes = (replace(n, gpus=tuple(g for g in n.gpus if g.ref in gpus)) for n in topology.nodes)
    return Topology(tuple(n for n in nodes if n.gpus))


def keep_to_caps(plan: Plan, view: ClusterView, caps: Mapping[Tenant, int], held: Mapping[Tenant, int]) -> Plan:
    """`plan` without the starts and resumes that would leave a tenant past its cap, or past what it holds
    (`held`) when that is more (the most-served of its takes go first), nor the suspends whose GPUs no kept
    decision then uses; repeated until it holds (a dropped take can leave a suspend unused, and a kept
    suspend is what made room for a take)."""
    decisions = list(plan.decisions)
    pruning = False  # suspends are pruned only once a take was dropped: the inner plan stands otherwise
    holding = _holding(view)
    while True:
        used: set[GpuRef] = {
            g for d in decisions if d.action is not Action.SUSPEND and d.placement for g in d.placement.gpus
        }
        kept = [
            d for d in decisions
            if not pruning
            or d.action is not Action.SUSPEND
            or (p := view.job(d.job_id).placement) is None
            or used.intersection(p.gpus)
        ]
        takes: dict[Tenant, list[Decision]] = {}  # a grow takes GPUs too
        count = _counts_after(kept, view, held, holding, takes)
        # A tenant above its cap may not grow, but may swap within what it holds (a suspend and a start of
        # its own: its short jobs need not wait for its long ones to end while others reclaim its surplus).
        over = sorted(t for t in takes if count[t] > max(caps.get(t, 0), held.get(t, 0)))
        if not over:
            return plan if len(kept) == len(plan.decisions) else Plan(tuple(kept))
        t = over[0]
        drop = max(takes[t], key=lambda d: (view.job(d.job_id).attained_service, d.job_id))
        decisions = _without(kept, view, drop)
        pruning = True


def keep_floors(
    decisions: list[Decision], view: ClusterView, caps: Mapping[Tenant, int], held: Mapping[Tenant, int]
) -> list[Decision]:
    """`decisions` without the suspends and shrinks that would leave a tenant below what it holds (`held`)
    or its cap, whichever is less, its own takes counted (and, transitively, what was placed on the GPUs
    its job then keeps): in a group of several tenants the inner policy rotates their jobs as one pool,
    and its order is not the shares' (gandiva lets a job short of its feedback preempt one past it: a
    sweep's new 1-GPU tasks stopped other tenants' 2-GPU jobs a minute before their end, the jobs of
    tenants at their caps, and their tenants then waited below their caps while GPUs idled). Only a cut
    whose GPUs another tenant's job is placed on goes: a tenant above its cap may still be taken down to
    it, and its own rotation (its GPUs to its own jobs) stays."""
    holding = _holding(view)
    skip: set[Tenant] = set()
    while True:
        count = _counts_after(decisions, view, held, holding)
        low = sorted(t for t in count if t not in skip and count[t] < min(held.get(t, 0), caps.get(t, 0)))
        if not low:
            return decisions
        t = low[0]
        others = {  # the GPUs the other tenants' decisions place jobs on
            g for d in decisions if d.placement and tenant_of(view.job(d.job_id)) != t for g in d.placement.gpus
        }
        cuts = []
        for d in decisions:
            j = view.job(d.job_id)
            if tenant_of(j) != t or j.state is not JobState.RUNNING or j.placement is None:
                continue
            if d.action is Action.SUSPEND or (d.action is Action.RESIZE and d.placement and d.placement.count < j.gpus):
                freed = set(j.placement.gpus) - set(d.placement.gpus if d.placement else ())
                if freed & others:  # its own rotation (its GPUs to its own jobs, or left free) is its own
                    cuts.append((j.attained_service, j.job_id, d))
        if not cuts:
            skip.add(t)
            continue
        decisions = _without(decisions, view, max(cuts, key=lambda c: (c[0], c[1]))[2])


def _holding(view: ClusterView) -> dict[Tenant, Counter[GpuRef]]:
    """Tenant -> GPU -> how many of its running jobs are on it (a packed GPU counts once for it)."""
    holding: dict[Tenant, Counter[GpuRef]] = {}
    for j in view.running:
        if j.placement is not None:
            holding.setdefault(tenant_of(j), Counter()).update(j.placement.gpus)
    return holding


def _counts_after(
    decisions: Iterable[Decision],
    view: ClusterView,
    held: Mapping[Tenant, int],
    holding: Mapping[Tenant, Counter[GpuRef]],
    takers: dict[Tenant, list[Decision]] | None = None,
) -> Counter[Tenant]:
    """The GPUs each tenant holds after `decisions` (`held` before them; `holding`: `_holding(view)`);
    `takers`, when given, gets each tenant's decisions that take GPUs (starts, resumes, grows)."""
    change: dict[Tenant, Counter[GpuRef]] = {}
    for d in decisions:
        j = view.job(d.job_id)
        t = tenant_of(j)
        c = change.setdefault(t, Counter())
        if j.state is JobState.RUNNING and j.placement is not None:
            c.subtract(j.placement.gpus)
        new = 0 if d.action is Action.SUSPEND or d.placement is None else d.placement.count
        if new:
            c.update(d.placement.gpus if d.placement is not None else ())
        if takers is not None and (d.action in _TAKES or (d.action is Action.RESIZE and new > j.gpus)):
            takers.setdefault(t, []).append(d)
    count: Counter[Tenant] = Counter(held)
    for t, ch in change.items():
        had = holding.get(t, Counter())
        count[t] += sum((had[g] + n > 0) - (had[g] > 0) for g, n in ch.items())
    return count


def _without(decisions: list[Decision], view: ClusterView, drop: Decision) -> list[Decision]:
    """`decisions` less `drop` and, transitively, those placed on GPUs that a dropped decision's job then
    keeps (a dropped grow leaves its job where it is)."""
    out = [d for d in decisions if d is not drop]
    stay = [drop]
    while stay:
        p = view.job(stay.pop().job_id).placement
        if p is None:
            continue
        hit = [d for d in out if d.placement and set(p.gpus).intersection(d.placement.gpus)]
        out = [d for d in out if all(d is not h for h in hit)]
        stay += hit
    return out
