"""What a launcher requires, checked against a machine made of injected probes (launch.tools)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import pytest
from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.launch import tools
from gaudi_cluster.launch.launchers import DEEPSPEED, MPIRUN, OPENMPI, PDSH, launcher_named
from gaudi_cluster.launch.plan import AgentSettings, OnPath, PlanInputs
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile

PY = "/opt/venv/bin/python"


def inputs(**over) -> PlanInputs:
    base = dict(
        hostfile=Hostfile((HostEntry("10.0.0.1", 2), HostEntry("10.0.0.2", 2))),
        hostfile_path="/j/hostfile",
        env={},
        env_path="/j/deepspeed_env",
        ssh_config_path="/j/ssh_config",
        ssh_port=3022,
        master_addr="10.0.0.1",
        master_port=29500,
        program=("prog",),
        python=PY,
        agent=AgentSettings("j1", "/run/gaudi-cluster/jobs", 10.0, None),
        this_node="10.0.0.1",
    )
    base.update(over)
    return PlanInputs(**base)


@dataclass
class Machine:
    """The probes of a machine with these programs on PATH, these Python modules and this Open MPI."""

    on_path: set[str] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    major: int = 4
    version_asked: int = 0

    def which(self, tool: str) -> str | None:
        return f"/usr/bin/{tool}" if tool in self.on_path else None

    def has_module(self, module: str) -> bool:
        return module in self.modules

    def mpirun_major(self) -> int:
        self.version_asked += 1
        return self.major

    def probes(self) -> dict:
        return {"which": self.which, "has_module": self.has_module, "mpirun_major": self.mpirun_major}


def unmet(launcher: str, here: Machine, **over) -> str | None:
    requirements = launcher_named(launcher).requires(inputs(**over))
    return tools.unmet_requirement(launcher, requirements, **here.probes())


def test_a_machine_with_everything_meets_every_launcher():
    here = Machine({PY, "ssh", "pdsh", "mpirun"}, {"deepspeed", "torch"}, major=5)
    for name in ("direct", "deepspeed", "mpirun"):
        assert unmet(name, here) is None, name
    assert unmet("torchrun", here, local=True) is None


def test_a_missing_tool_keeps_todays_message():
    message = unmet("mpirun", Machine({PY}))
    assert message == (
        "--launcher mpirun needs mpirun, which is not on PATH here; "
        "fix: install it (OpenMPI: apt-get install openmpi-bin) or choose another launcher"
    )


def test_a_multi_node_deepspeed_needs_pdsh_a_local_one_does_not():
    here = Machine({PY}, {"deepspeed"})
    assert (
        unmet("deepspeed", here)
        == f"--launcher deepspeed needs pdsh, which is not on PATH here; fix: {PDSH.fix}"
    )
    assert unmet("deepspeed", here, local=True, this_node=None) is None


def test_a_missing_python_module_is_named_with_its_fix():
    message = unmet("deepspeed", Machine({PY, "pdsh"}))
    assert message == (
        "--launcher deepspeed needs the Python module deepspeed, which this Python cannot import; "
        f"fix: {DEEPSPEED.fix}"
    )
    assert "torch" in (unmet("torchrun", Machine({PY}), local=True) or "")


def test_the_direct_launcher_needs_ssh_only_for_other_nodes():
    assert "needs ssh, which is not on PATH" in (unmet("direct", Machine({PY})) or "")
    assert unmet("direct", Machine({PY}), local=True, this_node=None) is None


@pytest.mark.parametrize("major", [3, 6])
def test_an_unsupported_open_mpi_is_named(major):
    message = unmet("mpirun", Machine({"mpirun"}, major=major))
    assert message == (
        f"--launcher mpirun needs Open MPI 4 or 5, and the mpirun here is Open MPI {major}; "
        f"fix: {OPENMPI.fix}"
    )


def test_the_version_is_asked_only_of_an_mpirun_that_is_there():
    absent = Machine(set(), major=3)
    assert "needs mpirun, which is not on PATH" in (unmet("mpirun", absent) or "")
    assert absent.version_asked == 0
    present = Machine({"mpirun"}, major=4)
    assert unmet("mpirun", present) is None
    assert present.version_asked == 1


def test_check_requirements_raises_cluster_not_ready():
    here = Machine({PY})
    with pytest.raises(ClusterNotReady, match=r"needs mpirun, which is not on PATH here; fix: install it"):
        tools.check_requirements("mpirun", (MPIRUN, OPENMPI), **here.probes())
    tools.check_requirements("direct", (OnPath(PY, "unused"),), **here.probes())


def test_importable_finds_without_importing():
    assert tools.importable("json") and not tools.importable("no_such_module_gc")
    assert not tools.importable("json.no_such_child")  # a missing parent-relative name is not an error


@pytest.mark.parametrize(
    ("out", "major"),
    [
        ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n", 4),
        ("mpirun (Open MPI) 5.0.3\n", 5),
        ("mpirun: unrecognised output\n", 4),  # cannot tell: Debian 12's and Habana's are 4
    ],
)
def test_openmpi_major_reads_mpirun_version(monkeypatch, out, major):
    def run(argv, **_kwargs):
        assert argv == ["mpirun", "--version"]
        return subprocess.CompletedProcess(argv, 0, stdout=out, stderr="")

    monkeypatch.setattr(tools.subprocess, "run", run)
    assert tools.openmpi_major() == major


def test_openmpi_major_without_mpirun_guesses_4(monkeypatch):
    def run(argv, **_kwargs):
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(tools.subprocess, "run", run)
    assert tools.openmpi_major() == 4
