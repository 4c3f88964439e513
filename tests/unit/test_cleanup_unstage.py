"""The master removes a private file, and reaps a stopped attempt, over its Reach only where no relay
did (issue 33): a node whose relay was told (or reaped) is left alone, a spare (no relay) is not, a lost
node is skipped, and nothing runs when every relay did it."""

from __future__ import annotations

from types import SimpleNamespace

from gaudi_cluster.nodes import cleanup


class RecordingReach:
    def __init__(self) -> None:
        self.runs: list[tuple[list[str], list[str]]] = []

    def run(self, hosts, argv, timeout_s, label):
        self.runs.append((list(hosts), list(argv)))
        return {host: SimpleNamespace(ok=True, code=0, why="") for host in hosts}


def survey(reach: RecordingReach, spares: tuple[str, ...] = ()) -> SimpleNamespace:
    names = {"10.0.0.1": "node-1", "10.0.0.2": "node-2", "10.0.0.3": "node-3"}
    return SimpleNamespace(
        job_id="j1",
        hosts=tuple(names),
        spares=spares,
        reach=reach,
        node_name=lambda host: names.get(host, host),
        reached_by=lambda: "over ssh",
    )


def test_only_the_nodes_no_relay_unstaged_and_the_spares_are_reached():
    reach = RecordingReach()
    cleanup.remove_private_files(survey(reach, spares=("10.0.0.9",)), "/run/jobs", {"10.0.0.1", "10.0.0.3"})
    [(hosts, argv)] = reach.runs
    assert hosts == ["10.0.0.2", "10.0.0.9"]
    assert argv == ["rm", "-f", "/run/jobs/j1/private.json"]


def test_nothing_is_run_when_every_relay_removed_its_nodes_file():
    reach = RecordingReach()
    cleanup.remove_private_files(survey(reach), "/run/jobs", {"10.0.0.1", "10.0.0.2", "10.0.0.3"})
    assert reach.runs == []


def test_before_a_launch_every_node_is_reached():
    reach = RecordingReach()
    cleanup.remove_private_files(survey(reach), "/run/jobs")
    assert reach.runs[0][0] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_a_stopped_attempt_is_reaped_by_the_master_only_where_no_relay_reaped_it():
    reach = RecordingReach()
    done = cleanup.reap_everywhere(survey(reach), "/run/jobs", {"node-3"}, {"10.0.0.1"})
    [(hosts, argv)] = reach.runs
    assert hosts == ["10.0.0.2"]
    assert argv[-5:] == ["reap", "--job-id", "j1", "--job-root", "/run/jobs"]
    assert done == cleanup.Cleanup(by_relay=("node-1",), by_master=("node-2",), skipped=("node-3",))
    assert done.to_dict() == {"by_relay": ["node-1"], "by_master": ["node-2"], "skipped": ["node-3"]}


def test_no_reap_runs_when_every_relay_reaped_its_node():
    reach = RecordingReach()
    done = cleanup.reap_everywhere(survey(reach), "/run/jobs", reaped={"10.0.0.1", "10.0.0.2", "10.0.0.3"})
    assert reach.runs == []
    assert done.by_relay == ("node-1", "node-2", "node-3") and done.by_master == ()
