"""Fairness of a simulation run among tenants (issue 30): finish-time fairness, GPU-time against shares, Jain.

A tenant is the fair-share layer's: (account, user) (`selector.fairshare.tenant_of`). Definitions:

- Entitled fraction: the account's share over all accounts' shares in the trace (1 each unless named),
  split equally among the account's users (Slurm's normalised shares, as `FairShare` splits GPUs).
- Finish-time fairness rho of a job (Themis, NSDI'20): its JCT in the shared run over its JCT when its
  tenant runs alone on its isolated share: the tenant's jobs only, same policy, same jobs (the models the
  shared run drew), on floor(GPUs x entitled fraction) GPUs (whole nodes when that is at least one node,
  else one node of that many GPUs; at least 1 GPU; a job asking for more is capped to it). rho <= 1: the
  job did no worse than on its own quota (HiveD's "no sharing anomaly"). A tenant's rho: the mean over
  its finished jobs (`worst_rho`: its largest).
- GPU-time received: the GPU-seconds its jobs held (`JobResult.gpu_seconds`). Entitled GPU-time: its
  fraction of the cluster's GPUs over the time it had jobs in the system (its first submission to its
  last finish, or the run's end). received/entitled above 1: it used GPUs others left idle.
- Jain's index over the tenants' received/entitled: (sum x)^2 / (n sum x^2), 1 when all equal, 1/n worst.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_gandiva.selector.base import Policy
from slurm_gandiva.selector.fairshare import Tenant
from slurm_gandiva.sim.engine import JobResult, SimConfig, SimResult, Simulator
from slurm_gandiva.sim.metrics import _table, mean
from slurm_gandiva.sim.trace import Trace


def tenants_of(trace: Trace) -> dict[str, Tenant]:
    """Job id -> its tenant (account, user)."""
    return {j.job_id: (j.account, j.user) for j in trace.jobs}


def entitled_fractions(tenants: Sequence[Tenant], shares: Mapping[str, float]) -> dict[Tenant, float]:
    """Each tenant -> its fraction of the cluster (see the module docstring)."""
    accounts = sorted({a for a, _ in tenants})
    raw = {a: float(shares.get(a, 1.0)) for a in accounts}
    total = sum(raw.values())
    users = {a: sorted({u for aa, u in tenants if aa == a}) for a in accounts}
    return {(a, u): raw[a] / total / len(users[a]) for a in accounts for u in users[a]}


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index of `xs` (nan when empty or all zero)."""
    sq = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * sq) if xs and sq > 0 else math.nan


@dataclass(frozen=True)
class TenantFairness:
    """One tenant's figures (seconds; rho nan when no isolated run was given or nothing finished)."""

    tenant: Tenant
    jobs: int
    finished: int
    fraction: float  # entitled fraction of the cluster
    avg_jct: float
    avg_rho: float
    worst_rho: float
    received: float  # GPU-seconds
    entitled: float  # GPU-seconds

    @property
    def name(self) -> str:
        a, u = self.tenant
        return f"{a}/{u}" if a else u

    @property
    def ratio(self) -> float:
        return self.received / self.entitled if self.entitled > 0 else math.nan


@dataclass(frozen=True)
class Fairness:
    """A run's fairness: per tenant, Jain's index, and rho over all jobs."""

    tenants: tuple[TenantFairness, ...]
    jain: float
    avg_rho: float  # over all finished jobs with an isolated JCT
    job_rho: Mapping[str, float]

    @property
    def worst_tenant_rho(self) -> float:
        rhos = [t.avg_rho for t in self.tenants if not math.isnan(t.avg_rho)]
        return max(rhos) if rhos else math.nan

    @staticmethod
    def of(
        result: SimResult,
        trace: Trace,
        shares: Mapping[str, float] | None = None,
        isolated: Mapping[str, float] | None = None,
    ) -> Fairness:
        """`result`'s fairness; `isolated`: job id -> its JCT alone on its tenant's share (`isolated_jcts`)."""
        owner = tenants_of(trace)
        tenants = sorted(set(owner.values()))
        frac = entitled_fractions(tenants, shares or {})
        total = result.total_gpus
        by: dict[Tenant, list[JobResult]] = {t: [] for t in tenants}
        for j in result.jobs:
            by[owner[j.job_id]].append(j)
        rho = {
            j.job_id: j.jct / isolated[j.job_id]
            for j in result.jobs
            if j.jct is not None and isolated is not None and isolated.get(j.job_id)
        }
        rows = []
        for t in tenants:
            jobs = by[t]
            fin = [j for j in jobs if j.jct is not None]
            start = min(j.submit for j in jobs)
            end = max((j.finish if j.finish is not None else result.end_time) for j in jobs)
            r = [rho[j.job_id] for j in fin if j.job_id in rho]
            rows.append(
                TenantFairness(
                    tenant=t,
                    jobs=len(jobs),
                    finished=len(fin),
                    fraction=frac[t],
                    avg_jct=mean([j.jct for j in fin if j.jct is not None]),
                    avg_rho=mean(r),
                    worst_rho=max(r) if r else math.nan,
                    received=sum(j.gpu_seconds for j in jobs),
                    entitled=frac[t] * total * max(0.0, end - start),
                )
            )
        ratios = [t.ratio for t in rows if not math.isnan(t.ratio)]
        return Fairness(tuple(rows), jain(ratios), mean(list(rho.values())), rho)


def isolated_config(config: SimConfig, gpus: int) -> SimConfig:
    """`config` shrunk to `gpus` GPUs: whole nodes where it holds one, else one node of `gpus`."""
    per = config.gpus_per_node
    if gpus >= per:
        return replace(config, nodes=gpus // per)
    return replace(config, nodes=1, gpus_per_node=gpus, gpus_per_switch=min(config.gpus_per_switch, gpus))


def isolated_jcts(
    trace: Trace,
    shared: SimResult,
    make_policy: Callable[[], Policy],
    config: SimConfig,
    shares: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Job id -> its JCT when its tenant runs alone on floor(GPUs x its fraction) GPUs, with a fresh
    `make_policy()` and the models `shared` drew (see the module docstring)."""
    model = {j.job_id: j.model for j in shared.jobs}
    owner = tenants_of(trace)
    frac = entitled_fractions(sorted(set(owner.values())), shares or {})
    out: dict[str, float] = {}
    for t, f in frac.items():
        gpus = max(1, math.floor(shared.total_gpus * f + 1e-9))
        jobs = tuple(replace(j, model=model.get(j.job_id, j.model)) for j in trace.jobs if owner[j.job_id] == t)
        alone = Trace(f"{trace.name}-alone", jobs).capped(gpus)
        cfg = isolated_config(config, gpus)
        res = Simulator(alone, make_policy(), cfg).run()
        out.update({j.job_id: j.jct for j in res.jobs if j.jct is not None})
    return out


def format_fairness(fair: Fairness) -> str:
    """A per-tenant table: jobs, share, average JCT, rho (average and worst), GPU-time received/entitled."""
    header = ["tenant", "done", "share %", "avg JCT h", "avg rho", "worst rho", "GPU-h got", "GPU-h due", "got/due"]
    rows = [header]
    for t in fair.tenants:
        rows.append(
            [
                t.name,
                f"{t.finished}/{t.jobs}",
                f"{100 * t.fraction:.1f}",
                _fmt(t.avg_jct / 3600),
                _fmt(t.avg_rho),
                _fmt(t.worst_rho),
                f"{t.received / 3600:.1f}",
                f"{t.entitled / 3600:.1f}",
                _fmt(t.ratio),
            ]
        )
    lines = [_table(rows)]
    lines.append(f"Jain's index over got/due: {_fmt(fair.jain, '{:.3f}')}; rho over all jobs {_fmt(fair.avg_rho)}")
    return "\n".join(lines)


def _fmt(v: float, fmt: str = "{:.2f}") -> str:
    return "-" if math.isnan(v) else fmt.format(v)
