"""The fair-share layer's pure parts: the hierarchical split, the decayed usage, the cap on a plan."""

from __future__ import annotations

import pytest

from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Locality, Placement, RateTable, Topology
from slurm_gandiva.plan import Action, Decision, Plan
from slurm_gandiva.selector import make_policy
from slurm_gandiva.selector.fairshare import FairShare, TenantUsage, keep_floors, keep_to_caps, water_fill


def job(jid: str, user: str, account: str = "", gpus: int = 1, at: GpuRef | None = None, served: float = 0.0) -> Job:
    spec = JobSpec(jid, user, gpus, gpus, 0.0, account=account)
    if at is None:
        return Job(spec, attained_service=served)
    return Job(spec, JobState.RUNNING, Placement((at,)), attained_service=served)


TOPO = Topology.uniform(2, 4)
G = TOPO.all_gpus()


def test_water_fill_by_weight_demand_and_order() -> None:
    assert water_fill(9, {"p": 100, "b": 100}, {"p": 2.0, "b": 1.0}, ["p", "b"]) == {"p": 6, "b": 3}
    assert water_fill(8, {"p": 2, "b": 100}, {"p": 2.0, "b": 1.0}, ["p", "b"]) == {"p": 2, "b": 6}  # lends
    assert water_fill(3, {"p": 9, "b": 9}, {"p": 1.0, "b": 1.0}, ["b", "p"]) == {"p": 1, "b": 2}  # rounding by order


def test_caps_split_accounts_by_share_then_users_equally() -> None:
    jobs = [job(f"p{u}{i}", u, "physics") for u in ("ann", "al") for i in range(8)]
    jobs += [job(f"b{i}", "bea", "bio") for i in range(8)]
    fair = FairShare(make_policy("fifo"), {"physics": 2, "bio": 1})
    caps = fair.caps(ClusterView(Topology.uniform(3, 4), tuple(jobs)))
    assert caps == {("physics", "ann"): 4, ("physics", "al"): 4, ("bio", "bea"): 4}


def test_usage_decays_by_half_life() -> None:
    state = TenantUsage()
    state.update(ClusterView(TOPO, (job("a", "alice", served=100.0),), now=0.0), half_life=10.0)
    state.update(ClusterView(TOPO, (job("a", "alice", served=100.0),), now=10.0), half_life=10.0)
    assert state.usage[("", "alice")] == pytest.approx(50.0)
    state.update(ClusterView(TOPO, (job("a", "alice", served=130.0),), now=10.0), half_life=10.0)
    assert state.usage[("", "alice")] == pytest.approx(80.0)


def test_over_cap_tenant_gives_back_gpus_to_a_waiting_one() -> None:
    jobs = [job(f"a{i}", "alice", at=G[i], served=100.0 + i) for i in range(8)]
    jobs += [job(f"a{i}", "alice") for i in range(8, 12)] + [job(f"b{i}", "bob") for i in range(4)]
    plan = FairShare(make_policy("fifo")).decide(ClusterView(TOPO, tuple(jobs), now=600.0), 600.0)
    suspended = {d.job_id for d in plan.decisions if d.action is Action.SUSPEND}
    started = {d.job_id for d in plan.decisions if d.action is Action.START}
    assert suspended == {"a4", "a5", "a6", "a7"}  # alice's most-served
    assert started == {"b0", "b1", "b2", "b3"}  # bob's, not alice's earlier-submitted jobs
    assert not ClusterView(TOPO, tuple(jobs)).consistency_errors()
    after = plan.apply(ClusterView(TOPO, tuple(jobs), now=600.0))
    assert not after.consistency_errors()


def test_keep_to_caps_drops_the_take_and_the_suspend_that_made_room() -> None:
    a = job("a0", "alice", at=G[0], served=5.0)
    b = job("b0", "bob", at=G[1], served=9.0)
    w = job("a1", "alice")
    view = ClusterView(TOPO, (a, b, w))
    plan = Plan((Decision(Action.SUSPEND, "b0"), Decision(Action.START, "a1", Placement((G[1],)))))
    caps = {("", "alice"): 1, ("", "bob"): 1}
    assert keep_to_caps(plan, view, caps, {("", "alice"): 1, ("", "bob"): 1}) == Plan()
    within = Plan((Decision(Action.SUSPEND, "a0"), Decision(Action.START, "a1", Placement((G[0],)))))
    assert keep_to_caps(within, view, caps, {("", "alice"): 1, ("", "bob"): 1}) == within  # alice rotates in hers


def test_a_tenant_above_its_cap_swaps_within_what_it_holds_but_does_not_grow() -> None:
    """Alice holds 3 GPUs for a cap of 1 (borrowed while bob was away): her short waiting job may take the
    GPU of one of her own long ones (as on her share alone), not a GPU more."""
    jobs = (*(job(f"a{i}", "alice", at=G[i], served=100.0 * (i + 1)) for i in range(3)), job("a9", "alice"))
    view = ClusterView(TOPO, jobs)
    caps, held = {("", "alice"): 1}, {("", "alice"): 3}
    swap = Plan((Decision(Action.SUSPEND, "a2"), Decision(Action.START, "a9", Placement((G[2],)))))
    assert keep_to_caps(swap, view, caps, held) == swap
    grow = Plan((Decision(Action.START, "a9", Placement((G[5],))),))
    assert keep_to_caps(grow, view, caps, held) == Plan()


def test_bad_shares_and_half_life_are_refused() -> None:
    with pytest.raises(ValueError, match="share of account 'bio'"):
        FairShare(make_policy("fifo"), {"bio": 0})
    with pytest.raises(ValueError, match="half_life"):
        FairShare(make_policy("fifo"), half_life=0)


def test_config_fairness_keys_are_checked() -> None:
    from slurm_gandiva.config import parse_config
    from slurm_gandiva.errors import ConfigError

    assert parse_config("").fairness == "none"
    cfg = parse_config("fairness = shares\nfairness_half_life = 3600\n")
    assert (cfg.fairness, cfg.fairness_half_life) == ("shares", 3600.0)
    with pytest.raises(ConfigError, match=r"^gandiva\.conf:2: fairness must be none or shares"):
        parse_config("quantum = 60\nfairness = tickets\n")
    with pytest.raises(ConfigError, match=r"^gandiva\.conf:1: fairness_half_life must be a positive"):
        parse_config("fairness_half_life = -1\n")
    assert parse_config("").fairness_steer_grows is False
    assert parse_config("fairness_steer_grows = yes\n").fairness_steer_grows is True
    with pytest.raises(ConfigError, match=r"^gandiva\.conf:1: fairness_steer_grows must be yes or no"):
        parse_config("fairness_steer_grows = maybe\n")


def test_steer_grows_reaches_the_layer_from_gandiva_conf_and_the_simulator() -> None:
    from slurm_gandiva.config import parse_config
    from slurm_gandiva.controller.service import make_configured_policy
    from slurm_gandiva.sim.cli import with_shares

    for text, want in (("fairness = shares\n", False), ("fairness = shares\nfairness_steer_grows = yes\n", True)):
        pol = make_configured_policy(parse_config(text))
        assert isinstance(pol, FairShare) and pol.steer_grows is want
    assert with_shares(make_policy("default"), {}, None, steer_grows=True).steer_grows is True
    assert with_shares(make_policy("default"), {}, None).steer_grows is False


def test_the_one_pass_paths_count_what_the_properties_did() -> None:
    """tenant_demand without limits, _starves and TenantUsage read every job once a round (10,000 live):
    finished jobs add no demand, suspended ones wait, never-served jobs are not remembered."""
    from slurm_gandiva.selector.fairshare import tenant_demand

    jobs = [job("a0", "alice", at=G[0], served=50.0), job("a1", "alice", gpus=2)]
    jobs += [job("b0", "bob", at=G[1], served=20.0).evolve(state=JobState.SUSPENDED, placement=None)]
    jobs += [job("b1", "bob", gpus=3).evolve(state=JobState.DONE), job("b2", "bob", gpus=4)]
    view = ClusterView(TOPO, tuple(jobs), now=100.0)
    assert tenant_demand(view) == {("", "alice"): 3, ("", "bob"): 5}
    state = TenantUsage()
    state.update(view, half_life=1e9)
    assert state.seen == {"a0": 50.0, "b0": 20.0}
    assert state.usage == {("", "alice"): 50.0, ("", "bob"): 20.0}
    # bob holds nothing, his smallest waiting job (b0, 1 GPU) fits his cap of 1; alice's 2-GPU one does not fit 1
    assert FairShare._starves(view, {("", "alice"): 2, ("", "bob"): 1})
    assert not FairShare._starves(view, {("", "alice"): 2, ("", "bob"): 0})


def test_one_tenant_is_decided_by_the_inner_policy_alone() -> None:
    jobs = tuple(job(f"a{i}", "alice") for i in range(3))
    view = ClusterView(TOPO, jobs, now=0.0)
    assert FairShare(make_policy("fifo")).decide(view, 0.0) == make_policy("fifo").decide(view, 0.0)


def test_a_gpu_left_by_rounding_stays_with_its_holder_for_a_quantum() -> None:
    """Two equal tenants on 3 GPUs: the third GPU goes to the one that used less, but the one holding it
    keeps it until it has used a quantum more (else it would change hands every tick or two)."""
    topo = Topology.uniform(1, 3)
    g = topo.all_gpus()
    jobs = (job("a0", "a", "a", at=g[0]), job("a1", "a", "a", at=g[1]), job("a2", "a", "a"),
            job("b0", "b", "b", at=g[2]), job("b1", "b", "b"))
    view = ClusterView(topo, jobs)
    fair = FairShare(make_policy("gandiva", quantum=60.0))
    fair.state.usage = {("a", "a"): 1030.0, ("b", "b"): 1000.0}
    assert fair.caps(view) == {("a", "a"): 2, ("b", "b"): 1}  # a holds it, 30 s ahead: keeps it
    fair.state.usage = {("a", "a"): 1070.0, ("b", "b"): 1000.0}
    assert fair.caps(view) == {("a", "a"): 1, ("b", "b"): 2}  # over a quantum ahead: b's turn
    fifo = FairShare(make_policy("fifo"))  # no quantum: no credit, the lower usage gets it at once
    fifo.state.usage = {("a", "a"): 1030.0, ("b", "b"): 1000.0}
    assert fifo.caps(view) == {("a", "a"): 1, ("b", "b"): 2}


@pytest.mark.parametrize("inner", ["afs-l", "default"])
def test_with_steered_grows_an_elastic_tenant_whose_jobs_all_run_grows_to_its_cap(inner: str) -> None:
    """No job waits, yet the inner policy's rule gave one tenant's short jobs the GPUs the other's long job
    would have grown into on its share alone: with `steer_grows`, the long job grows to its tenant's cap;
    without it (the default) the inner policy's global rule stands, as no tenant is short."""
    linear = RateTable({(k, Locality.SWITCH): 10.0 * k for k in range(1, 9)})
    topo = Topology.uniform(1, 8)
    g = topo.all_gpus()

    def run(jid: str, user: str, work: float, gpus: tuple[GpuRef, ...]) -> Job:
        spec = JobSpec(jid, user, 1, 8, 0.0, total_work=work, account=user)
        return Job(spec, JobState.RUNNING, Placement(gpus), rates=linear, slice_start=0.0, first_start=0.0,
                   times_scheduled=3)

    jobs = (run("s0", "sam", 100.0, g[0:3]), run("s1", "sam", 100.0, g[3:6]), run("l", "lee", 1e4, g[6:8]))
    view = ClusterView(topo, jobs, now=3600.0)
    alone = make_policy(inner).decide(view, 3600.0).apply(view)
    assert alone.job("l").gpus == 2  # AFS-L's rule: the short jobs keep the spare GPUs
    fair = FairShare(make_policy(inner), steer_grows=True)
    after = fair.decide(view, 3600.0).apply(view)
    assert after.job("l").gpus == 4 and after.job("s0").gpus + after.job("s1").gpus == 4
    assert not after.consistency_errors()
    plain = FairShare(make_policy(inner)).decide(view, 3600.0).apply(view)
    assert plain.job("l").gpus == 2


def test_a_move_dropped_onto_a_contested_gpu_takes_what_was_placed_where_it_stays() -> None:
    """Alice (at her cap, a job waiting) is decided alone on her GPUs, bob with the free ones; G3 is packed by
    both. Alice's inner plan moves a0 onto G3's shard and resumes a9 on G0: the move is dropped (neither
    group saw the other's shard), so a0 stays on G0 and a9's resume there must go too (found at 500 jobs a
    VC, load 1.5, under gandiva: a resume on a GPU whose holder's migrate was dropped; the simulator refused
    the plan)."""
    shared = Placement((G[3],), shared=True)
    jobs = (
        *(job(f"a{i}", "alice", at=G[i]) for i in range(3)),
        Job(JobSpec("a3", "alice", 1, 1, 0.0), JobState.RUNNING, shared),
        Job(JobSpec("b3", "bob", 1, 1, 0.0), JobState.RUNNING, shared),
        job("b4", "bob", at=G[4]),
        Job(JobSpec("a9", "alice", 1, 1, 0.0), JobState.SUSPENDED),
        *(job(f"b{i}", "bob") for i in range(9, 12)),
    )
    view = ClusterView(TOPO, jobs)
    assert not view.consistency_errors()
    assert FairShare(make_policy("fifo")).caps(view) == {("", "alice"): 4, ("", "bob"): 4}

    class Scripted:
        name = "scripted"

        def decide(self, v: ClusterView, now: float) -> Plan:
            ids = {j.job_id for j in v.jobs}
            if "a9" in ids and "b9" not in ids:  # alice's group alone
                return Plan((Decision(Action.MIGRATE, "a0", shared), Decision(Action.RESUME, "a9", Placement((G[0],)))))
            return Plan()

    plan = FairShare(Scripted()).decide(view, 0.0)
    assert not plan.apply(view).consistency_errors()
    assert {d.job_id for d in plan.decisions} == set()


def test_a_tenant_with_a_waiting_job_wider_than_its_headroom_is_decided_alone() -> None:
    """Alice holds 3 GPUs of her cap of 4 and waits with a 4-GPU job: in the shared group its start would pass
    her cap and be dropped every round, so she is decided alone on her own GPUs (where her policy may stop her
    own jobs for it), as at her cap. Bob, below his cap with a 1-GPU job waiting, decides with the free GPUs."""
    jobs = (
        *(job(f"a{i}", "alice", at=G[i]) for i in range(3)),
        Job(JobSpec("a9", "alice", 4, 4, 0.0)),
        job("b4", "bob", at=G[4]), job("b5", "bob", at=G[5]),
        *(job(f"b{i}", "bob") for i in range(9, 13)),
    )
    view = ClusterView(TOPO, jobs)
    seen: list[tuple[set[str], int]] = []

    class Recording:
        name = "recording"

        def decide(self, v: ClusterView, now: float) -> Plan:
            seen.append(({j.job_id for j in v.jobs}, len(v.topology.all_gpus())))
            return Plan()

    fair = FairShare(Recording())
    assert fair.caps(view) == {("", "alice"): 4, ("", "bob"): 4}
    fair.decide(view, 0.0)
    assert ({"a0", "a1", "a2", "a9"}, 3) in seen  # alone, on her 3 GPUs
    assert ({"b4", "b5", *(f"b{i}" for i in range(9, 13))}, 5) in seen  # bob: his 2 and the 3 free

    class NeverPreempts(Recording):  # as slurm and fifo: alone, a9 would wait for her own jobs to end
        preempts = False

    seen.clear()
    FairShare(NeverPreempts()).decide(view, 0.0)
    assert seen and all("a9" in ids and "b4" in ids for ids, _ in seen), seen  # decided with bob


def test_keep_floors_drops_a_cut_below_a_share_for_another_tenants_job() -> None:
    """Bob holds his cap (1 GPU): a suspend of his job for alice's start on that GPU goes, and the start with
    it; alice's start on a free GPU stays; bob's own rotation stays; carol above her cap of 1 may be taken
    down to it, not below."""
    b0, b1 = job("b0", "bob", at=G[0], served=9.0), job("b1", "bob")
    c0, c1 = job("c0", "carol", at=G[2], served=5.0), job("c1", "carol", at=G[3], served=6.0)
    view = ClusterView(TOPO, (b0, b1, c0, c1, job("a0", "alice"), job("a1", "alice"), job("a2", "alice")))
    caps = {("", "alice"): 2, ("", "bob"): 1, ("", "carol"): 1}
    held = {("", "bob"): 1, ("", "carol"): 2}
    on_bob = [Decision(Action.SUSPEND, "b0"), Decision(Action.START, "a0", Placement((G[0],)))]
    free = [Decision(Action.START, "a1", Placement((G[1],)))]
    assert keep_floors([*on_bob, *free], view, caps, held) == free
    own = [Decision(Action.SUSPEND, "b0"), Decision(Action.START, "b1", Placement((G[0],)))]
    assert keep_floors(own, view, caps, held) == own
    carol = [Decision(Action.SUSPEND, "c1"), Decision(Action.START, "a1", Placement((G[3],)))]
    assert keep_floors(carol, view, caps, held) == carol  # 2 -> 1: down to her cap
    both = [Decision(Action.SUSPEND, "c0"), *carol, Decision(Action.START, "a2", Placement((G[2],)))]
    kept = keep_floors(both, view, caps, held)
    assert sum(d.action is Action.SUSPEND for d in kept) == 1 and len(kept) == 2  # one cut and its start
