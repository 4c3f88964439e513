"""Host tools the tests run (scripts/host-tools.sh installs them): a missing one fails the test that
needs it, naming the tool and the command that installs it, instead of skipping it."""

from __future__ import annotations

import shutil

import pytest

PACKAGE_OF = {
    "pdsh": "pdsh",
    "mpirun": "openmpi-bin",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}


def require(tool: str) -> str:
    """The tool's path; a failure naming it when it is missing."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"{tool} is not installed on this host; fix: make host-tools "
            f"(as root: apt-get install -y {PACKAGE_OF.get(tool, tool)})",
            pytrace=False,
        )
    return path
