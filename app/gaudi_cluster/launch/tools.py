"""Whether this machine has what a launcher `requires()`: programs on PATH, Python modules, and the
Open MPI version of its mpirun. The edge half of `launchers`; each probe is a parameter, so tests
need none of the tools.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Callable, Iterable

from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.launch.plan import OnPath, OpenMpiMajor, PythonModule, Requirement


def openmpi_major() -> int:
    """The major version of the mpirun on PATH (4 when it cannot tell: Debian 12's and Habana's)."""
    try:
        out = subprocess.run(
            ["mpirun", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 4
    for word in out.split():
        if word[:1].isdigit() and "." in word:
            return int(word.split(".")[0])
    return 4


def importable(module: str) -> bool:
    """Whether this interpreter finds `module`, without importing it (torch takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unmet_requirement(
    launcher: str,
    requirements: Iterable[Requirement],
    *,
    which: Callable[[str], str | None] = shutil.which,
    has_module: Callable[[str], bool] = importable,
    mpirun_major: Callable[[], int] = openmpi_major,
) -> str | None:
    """The first requirement this machine misses, as one line naming it and the fix; None if none.

    In the order given, so that a missing mpirun is reported as such, not as a wrong version.
    """
    for need in requirements:
        if isinstance(need, OnPath) and not which(need.tool):
            return f"--launcher {launcher} needs {need.tool}, which is not on PATH here; fix: {need.fix}"
        if isinstance(need, PythonModule) and not has_module(need.module):
            return (
                f"--launcher {launcher} needs the Python module {need.module}, which this Python "
                f"cannot import; fix: {need.fix}"
            )
        if isinstance(need, OpenMpiMajor) and (major := mpirun_major()) not in need.majors:
            wanted = " or ".join(map(str, need.majors))
            return (
                f"--launcher {launcher} needs Open MPI {wanted}, and the mpirun here is Open MPI {major}; "
                f"fix: {need.fix}"
            )
    return None


def check_requirements(
    launcher: str,
    requirements: Iterable[Requirement],
    *,
    which: Callable[[str], str | None] = shutil.which,
    has_module: Callable[[str], bool] = importable,
    mpirun_major: Callable[[], int] = openmpi_major,
) -> None:
    """Raise ClusterNotReady (nothing launched yet) on the first requirement this machine misses."""
    problem = unmet_requirement(
        launcher, requirements, which=which, has_module=has_module, mpirun_major=mpirun_major
    )
    if problem:
        raise ClusterNotReady(problem)
