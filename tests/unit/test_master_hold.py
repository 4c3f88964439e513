"""A held master (GAUDI_CLUSTER_HOLD, the AWS master) prepares the cluster and launches nothing."""

from __future__ import annotations

import io
import signal
from types import SimpleNamespace

from gaudi_cluster import master
from gaudi_cluster.nodes import cleanup
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile
from gaudi_cluster.settings.config import resolve_config


def test_a_held_master_removes_the_private_files_its_preparation_staged(monkeypatch, tmp_path):
    """No rank of the held preparation ever starts, so nothing else would remove its private files:
    the --env-pass values (HF_TOKEN) would stay on every node, the master's in its host's jobs dir."""
    calls: list[str] = []
    survey = SimpleNamespace(release=lambda: calls.append("release"))
    job = SimpleNamespace(survey=survey, hostfile=Hostfile((HostEntry("node-1", 1),)))
    monkeypatch.setattr(master, "prepare_attempt", lambda settings, program, environ: job)
    monkeypatch.setattr(cleanup, "remove_private_files", lambda given, root: calls.append(f"unstage {root}"))
    handlers = {}
    monkeypatch.setattr(master.signal, "signal", handlers.setdefault)
    monkeypatch.setattr(master.time, "sleep", lambda _s: handlers[signal.SIGTERM](signal.SIGTERM, None))
    env = {"GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "jobs"), "GAUDI_CLUSTER_ENV_PASS": "HF_TOKEN"}
    assert master.hold(resolve_config({}, env), {**env, "HF_TOKEN": "hf_x"}, io.StringIO()) == 0
    assert calls == [f"unstage {tmp_path / 'jobs'}", "release"]
