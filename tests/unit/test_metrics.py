"""--metrics-port: the job's figures in the Prometheus text format, from prometheus_client."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.supervise import metrics_serving
from gaudi_cluster.supervise.metrics_serving import MetricsServer
from gaudi_cluster.supervise.supervisor import SupervisorPhase
from gaudi_cluster.view.figures import job_figures
from gaudi_cluster.view.jobview import AgentState, RateMeter, Straggler
from gaudi_cluster.view.metrics import NAMES
from prometheus_client.parser import text_string_to_metric_families

STATES = [phase.value for phase in SupervisorPhase]


def agents(step: int) -> list[AgentState]:
    def work(rank: int) -> tuple[tuple[int, float], ...]:
        return tuple((s, 0.5 if rank == 1 else 0.2) for s in range(1, step + 1))

    return [
        AgentState(host=f"w{rank}", rank=rank, pid=1, last_seen=99.0, step=step, max_steps=40,
                   samples_per_step=12, recent_work=work(rank))
        for rank in range(3)
    ]  # fmt: skip


def figures(step: int, state: str = "running"):
    rate = RateMeter()
    rate.add(90.0, step - 5)
    rate.add(100.0, step)
    flagged = {1: Straggler("w1", 1, 0, 0.5, 0.2)}
    return job_figures(agents(step), 101.5, 12.0, rate, flagged, "job-1", state, restarts=1)


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples, name: str, **labels: str) -> float:
    return next(
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_the_endpoint_serves_the_job_and_follows_it():
    current = {"figures": figures(10)}
    # Only this server's threads: a session fixture of another folder (moto's) may still be serving.
    before = set(threading.enumerate())
    server = MetricsServer("127.0.0.1", 0, STATES)
    try:
        assert scrape(server.port) == {} or "gaudi_cluster_step" not in scrape(server.port)  # nothing yet
        server.follow(lambda: current["figures"])
        families = scrape(server.port)
        ours = {name for name in families if name.startswith("gaudi_cluster")}
        # The text format's parser names a counter without its _total suffix.
        assert ours == {n.removesuffix("_total") for n in NAMES}
        assert value(families["gaudi_cluster_step"], "gaudi_cluster_step") == 10
        assert value(families["gaudi_cluster_samples_per_second"], "gaudi_cluster_samples_per_second") == 6.0
        assert value(families["gaudi_cluster_restarts"], "gaudi_cluster_restarts_total") == 1
        work = families["gaudi_cluster_rank_work_seconds"]
        assert value(work, "gaudi_cluster_rank_work_seconds", host="w1", rank="1") == 0.5
        assert {tuple(sorted(s.labels)) for s in work} == {("host", "rank")}
        ages = families["gaudi_cluster_rank_heartbeat_age_seconds"]
        assert value(ages, "gaudi_cluster_rank_heartbeat_age_seconds", host="w0", rank="0") == 2.5
        assert value(families["gaudi_cluster_rank_straggler"], "gaudi_cluster_rank_straggler", rank="1") == 1
        assert value(families["gaudi_cluster_stragglers"], "gaudi_cluster_stragglers") == 1
        states = families["gaudi_cluster_job_state"]
        assert value(states, "gaudi_cluster_job_state", gaudi_cluster_job_state="running") == 1
        assert sum(s.value for s in states) == 1 and len(states) == len(STATES)
        assert value(families["gaudi_cluster_job_info"], "gaudi_cluster_job_info", job_id="job-1") == 1
        current["figures"] = figures(20, "succeeded")  # the values move with the job
        families = scrape(server.port)
        assert value(families["gaudi_cluster_step"], "gaudi_cluster_step") == 20
        assert value(families["gaudi_cluster_job_state"], "gaudi_cluster_job_state",
                     gaudi_cluster_job_state="succeeded") == 1  # fmt: skip
    finally:
        server.close()
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_label_sets_stay_bounded_by_the_job_for_a_thousand_nodes():
    big = [AgentState(host=f"n{r // 8}", rank=r, pid=1, last_seen=1.0, step=5) for r in range(8000)]
    f = job_figures(big, 2.0, 1.0, RateMeter(), {}, "j", "running", 0)
    from gaudi_cluster.view.metrics import JobCollector

    families = list(JobCollector(lambda: f, STATES).collect())
    per_rank = [fam for fam in families if fam.name.startswith("gaudi_cluster_rank_")]
    assert all(len(fam.samples) <= 8000 for fam in per_rank)
    labels = {key for fam in families for sample in fam.samples for key in sample.labels}
    assert labels <= {"host", "rank", "state", "job_id", "gaudi_cluster_job_state"}


def test_metrics_are_off_by_default_and_bound_to_localhost():
    config = resolve_config({}, {})
    assert config.metrics_port is None and config.metrics_addr == "127.0.0.1"
    config = resolve_config({"metrics_port": "9400"}, {"GAUDI_CLUSTER_METRICS_ADDR": "0.0.0.0"})
    assert (config.metrics_port, config.metrics_addr) == (9400, "0.0.0.0")
    with pytest.raises(ConfigError, match="fix: --metrics-port 9400"):
        resolve_config({"metrics_port": "29400"}, {})


def test_a_port_in_use_is_one_line_naming_another():
    first = MetricsServer("127.0.0.1", 0, STATES)
    try:
        with pytest.raises(ConfigError) as caught:
            MetricsServer("127.0.0.1", first.port, STATES)
        assert f"fix: --metrics-port {first.port + 1}" in str(caught.value)
    finally:
        first.close()


def test_idle_half_sent_requests_hold_no_thread_and_a_scrape_still_answers(monkeypatch):
    """50 peers that send half a request and wait: no thread per connection (prometheus_client's server
    held 50), at most MAX_CONNECTIONS held, a real scrape answers at once (the oldest idle one makes
    room), and the rest are cut at their deadline."""
    monkeypatch.setattr(metrics_serving, "REQUEST_TIMEOUT_S", 1.5)
    before = set(threading.enumerate())
    server = MetricsServer("127.0.0.1", 0, STATES)
    server.follow(lambda: figures(10))
    idle = []
    try:
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the empty line that ends it
            idle.append(sock)
        deadline = time.monotonic() + 5
        while server.connections < metrics_serving.MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connections == metrics_serving.MAX_CONNECTIONS  # the older ones made room
        assert len([t for t in threading.enumerate() if t not in before]) == 1  # the one loop
        started = time.monotonic()
        assert value(scrape(server.port)["gaudi_cluster_step"], "gaudi_cluster_step") == 10
        assert time.monotonic() - started < 1.5  # not after the idle ones' deadline
        assert all(sock.recv(1) == b"" for sock in idle)  # every idle one cut: made room or timed out
        assert server.connections == 0
        assert len([t for t in threading.enumerate() if t not in before]) == 1
    finally:
        for sock in idle:
            sock.close()
        server.close()
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_a_scrape_among_idle_peers_answers_and_odd_requests_get_a_status():
    server = MetricsServer("127.0.0.1", 0, STATES)
    server.follow(lambda: figures(10))
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(5)]
    try:
        for sock in idle:
            sock.sendall(b"GET /metr")
        assert value(scrape(server.port)["gaudi_cluster_step"], "gaudi_cluster_step") == 10
        for path, status in (("/nothing", 404),):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5)
            assert caught.value.code == status
        post = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(post, timeout=5)
        assert caught.value.code == 405
    finally:
        for sock in idle:
            sock.close()
        server.close()
