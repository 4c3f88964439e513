"""The node path's processes import only what their own path uses (issue 34).

Every node starts several short Python processes before a rank runs (nodewatch, the probe,
launch.node, one rank agent per rank, the relay): each module below is imported in a fresh
interpreter, and what only another path needs must not be loaded by the import itself. The interpreter
runs with -S: no site (this venv's editable finder loads pathlib and re at start; the image, which puts
app/ on sys.path with a plain .pth, has none), so the list is what the module itself pulls in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
# Never on any of these paths: package metadata (a probe's report reads it, in the function).
NOWHERE = {"importlib.metadata", "email", "zipfile"}
LEAN = {
    # relay_join finds the relay's socket in jobdir; the unsealed agent makes no MAC; zygote_client
    # only with --zygote-fd, subprocess only to start a rank or the relay, shutil for a failed rank.
    "gaudi_cluster.rank.agent": {
        "gaudi_cluster.rank.relay",
        "gaudi_cluster.rank.relay_beats",
        "gaudi_cluster.rank.zygote_client",
        "gaudi_cluster.rank.zygote_rules",
        "statistics",
        "hashlib",
        "hmac",
        "secrets",
        "random",
        "shutil",
        "subprocess",
    },
    # Its MACs load hashlib and hmac at its first handshake, not at its import.
    "gaudi_cluster.rank.relay": {"hashlib", "hmac", "secrets"},
    # role, follow and release: the master's release_workers (ssh, the reaches, logging) is not theirs.
    "gaudi_cluster.engines.nodewatch": {
        "gaudi_cluster.nodes.ssh",
        "gaudi_cluster.nodes.reach",
        "gaudi_cluster.nodes.parallel",
        "gaudi_cluster.wire.node_spec",
        "gaudi_cluster.rank.jobdir",
        "logging",
        "subprocess",
        "hashlib",
        "secrets",
    },
    # Its own process (the master runs `python -m gaudi_cluster.nodes.probe` on every node): not the
    # CLI's parsers, nor the master's settings (10 of the probe's 62 ms when it went through them).
    "gaudi_cluster.nodes.probe": {
        "gaudi_cluster.nodes.srun",
        "hashlib",
        "secrets",
        "gaudi_cluster.cli",
        "gaudi_cluster.settings.config",
        "gaudi_cluster.settings.flags",
    },
    # `python -m gaudi_cluster probe` and `reap` run on every node of every job: the CLI sets up its
    # logging without the live view (its figures and dataclasses are the master's console's).
    "gaudi_cluster.cli": {
        "gaudi_cluster.view.liveview",
        "gaudi_cluster.view.figures",
        "gaudi_cluster.view.jobview",
    },
    # srun only with --from-launch (Slurm), tempfile only for a zygote, hashlib only to name one.
    "gaudi_cluster.launch.node": {"gaudi_cluster.nodes.srun", "tempfile", "hashlib", "random", "shutil"},
}


def loaded_by(module: str) -> set[str]:
    code = (
        f"import sys, json, gaudi_cluster, {module}; "
        "print(json.dumps([gaudi_cluster.__file__, sorted(sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(APP), "PATH": os.environ.get("PATH", "")},
        timeout=60,
    )
    where, modules = json.loads(done.stdout)
    assert Path(where).is_relative_to(APP), where  # this tree's package, not another install's
    return set(modules)


@pytest.mark.parametrize("module", sorted(LEAN))
def test_an_entry_module_imports_only_what_its_path_uses(module):
    modules = loaded_by(module)
    assert module in modules
    assert not (LEAN[module] | NOWHERE) & modules, sorted((LEAN[module] | NOWHERE) & modules)


def test_the_probe_as_the_master_runs_it_loads_neither_the_cli_nor_the_settings(tmp_path):
    """The whole run, not just the import: its parser and report stay off the master's settings."""
    done = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", "-m", "gaudi_cluster.nodes.probe", "--json",
         "--accelerator", "cpu", "--slots", "2", "--path", str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=tmp_path, timeout=60,
        env={"PYTHONPATH": str(APP), "PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "gaudi_cluster.nodes.probe" not in loaded  # run as __main__, not imported a second time
    assert not loaded & {"gaudi_cluster.cli", "gaudi_cluster.settings.config", *NOWHERE}, sorted(loaded)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["slots"] == 2 and report["paths"] == {str(tmp_path): True}
