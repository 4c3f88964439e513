"""The master removes a private file over its Reach only where no relay did (issue 33): a node whose
relay was told is left alone, a spare (no relay) is not, and nothing runs when every relay was told."""

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
    return SimpleNamespace(
        job_id="j1", hosts=("10.0.0.1", "10.0.0.2", "10.0.0.3"), spares=spares, reach=reach
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
