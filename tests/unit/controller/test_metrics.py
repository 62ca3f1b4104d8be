"""Prometheus metrics: values checked by scraping the text exposition (in memory and over HTTP)."""

from __future__ import annotations

import urllib.request

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from slurm_gandiva.controller.metrics import Metrics
from slurm_gandiva.model import ClusterView, GpuRef, Job, JobSpec, JobState, Placement, Topology
from slurm_gandiva.plan import Action
from slurm_gandiva.store import SliceEnd


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _view() -> ClusterView:
    topo = Topology.uniform(2, 4)
    jobs = (
        Job(JobSpec("1", "a", 2, 2, 0.0), JobState.RUNNING, Placement((GpuRef("n1", 0), GpuRef("n1", 1)))),
        Job(JobSpec("2", "a", 1, 1, 0.0), JobState.RUNNING, Placement((GpuRef("n2", 0),), shared=True)),
        Job(JobSpec("3", "b", 1, 1, 0.0), JobState.RUNNING, Placement((GpuRef("n2", 0),), shared=True)),
        Job(JobSpec("4", "b", 1, 1, 0.0), JobState.SUSPENDED),
        Job(JobSpec("5", "b", 1, 1, 0.0), JobState.QUEUED),
        Job(JobSpec("6", "b", 1, 1, 0.0), JobState.QUEUED),
        Job(JobSpec("7", "b", 1, 1, 0.0), JobState.DONE),
    )
    return ClusterView(topo, jobs, 10.0)


def test_gauges_from_view() -> None:
    m = Metrics()
    m.observe_view(_view())
    s = _samples(m.exposition())
    assert s[("gandiva_queue_length", ())] == 3
    assert s[("gandiva_jobs", (("state", "running"),))] == 3
    assert s[("gandiva_jobs", (("state", "suspended"),))] == 1
    assert s[("gandiva_jobs", (("state", "queued"),))] == 2
    assert s[("gandiva_gpus", (("use", "busy"),))] == 3
    assert s[("gandiva_gpus", (("use", "free"),))] == 5
    assert s[("gandiva_gpu_utilisation_ratio", ())] == 3 / 8


def test_counters_and_step_histogram() -> None:
    m = Metrics()
    m.slice_started()
    m.slice_started()
    m.slice_ended(SliceEnd.QUANTUM)
    m.decision(Action.SUSPEND, "succeeded")
    m.step("signal", 0.02)
    m.step("signal", 3.0)
    m.step("wait_checkpoint", 7.0, ok=False)
    m.tick(0.2)
    s = _samples(m.exposition())
    assert s[("gandiva_slices_started_total", ())] == 2
    assert s[("gandiva_slices_ended_total", (("reason", "quantum"),))] == 1
    assert s[("gandiva_decisions_total", (("action", "suspend"), ("outcome", "succeeded")))] == 1
    assert s[("gandiva_protocol_steps_total", (("result", "ok"), ("step", "signal")))] == 2
    assert s[("gandiva_protocol_steps_total", (("result", "failed"), ("step", "wait_checkpoint")))] == 1
    assert s[("gandiva_protocol_step_seconds_count", (("step", "signal"),))] == 2
    assert s[("gandiva_protocol_step_seconds_sum", (("step", "signal"),))] == 3.02
    assert s[("gandiva_protocol_step_seconds_bucket", (("le", "0.05"), ("step", "signal")))] == 1
    assert s[("gandiva_protocol_step_seconds_bucket", (("le", "5.0"), ("step", "signal")))] == 2
    assert s[("gandiva_tick_seconds_count", ())] == 1


def test_registries_are_private() -> None:
    a, b = Metrics(), Metrics()
    a.slice_started()
    assert _samples(b.exposition())[("gandiva_slices_started_total", ())] == 0
    assert REGISTRY.get_sample_value("gandiva_slices_started_total") is None


def test_serve_exposes_text_over_http() -> None:
    m = Metrics()
    m.observe_view(_view())
    srv = m.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as resp:
            body = resp.read()
            assert resp.headers["Content-Type"].startswith("text/plain")
    finally:
        srv.stop()
    assert _samples(body)[("gandiva_queue_length", ())] == 3
