"""Whether a node's card, host driver and paths fit its image's profile (pure): the doctor's image checks.

Habana supports a host driver and a container of the same release, and on Gaudi 2 only, of adjacent
releases; first-generation Gaudi ends with 1.21. So a node is judged by its card generation (hl-smi's
device name) and its driver release against the profile's release, and a mismatch names the profile to
build instead. The profile also says where Open MPI, libfabric and the EFA libraries are: the probe
reports whether each exists on the node, and the major of its mpirun, whose flags the launchers use.
"""

from __future__ import annotations

from dataclasses import dataclass

from gaudi_cluster.settings import profiles
from gaudi_cluster.wire.node_report import NodeReport


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    ok: bool
    detail: str
    fix: str = ""
    blocking: bool = True


def driver_findings(host: str, report: NodeReport) -> list[Finding]:
    """The card generation and host driver against the image profile's release: a first-gen card under a
    1.22+ image, or a driver and an image that Habana does not pair, blocks with the profile to build."""
    name = report.profile
    if not name:
        return []
    matrix = profiles.matrix()
    if name not in matrix.profiles:
        return [
            Finding(host, "driver", False, f"image profile '{name}' is unknown here", "rebuild the image")
        ]
    profile = matrix.profile(name)
    generation = matrix.generation_of(report.device_name)
    node = f"{host} ({report.hostname})" if report.hostname not in (None, host) else host
    card = f"{report.device_name} ({profiles.GENERATION_NAMES[generation]})" if generation else None
    version = report.driver_version
    if generation is not None and generation not in profile.generations:
        fitting = [p.name for p in matrix.profiles.values() if generation in p.generations]
        detail = (
            f"{card} on {node} is not supported by the image's Synapse {profile.synapse_version} "
            f"(profile {name}: {', '.join(profile.generations)})"
        )
        fix = f"run the {fitting[0]} profile's image (make image PROFILE={fitting[0]})" if fitting else ""
        return [Finding(host, "driver", False, detail, fix or "use a supported card")]
    if not version:
        detail = (
            f"`hl-smi -Q driver_version` gave no version to compare with Synapse {profile.synapse_version}"
        )
        return [Finding(host, "driver", False, detail, "check hl-smi on the node", blocking=False)]
    driver_release = profiles.release(version)
    why = matrix.pairs_with(profile, generation, driver_release)
    on = f" on {card}" if card else ""
    if why is None:
        adjacent = driver_release != profile.synapse_release
        detail = f"host driver {version}{on}, image {name} Synapse {profile.synapse_version}"
        detail += " (adjacent releases, supported on Gaudi 2)" if adjacent else ""
        return [Finding(host, "driver", True, detail)]
    fitting = matrix.fitting_profiles(generation, driver_release)
    fix = f"install the {profile.synapse_release}.x driver on {host}"
    fix += f", or run the {fitting[0]} profile's image (make image PROFILE={fitting[0]})" if fitting else ""
    detail = (
        f"host driver {version} on {node} does not match the image's Synapse "
        f"{profile.synapse_version} (profile {name}): {why}"
    )
    return [Finding(host, "driver", False, detail, fix)]


def profile_path_findings(host: str, report: NodeReport) -> list[Finding]:
    """Each path the image profile puts Open MPI, libfabric and EFA at, on this node; and the major of
    its Open MPI, whose launch flags the launchers use."""
    profile = profiles.matrix().profiles.get(report.profile or "")
    if profile is None:
        return []
    fix = f"run the {profile.name} profile's image, built by make image PROFILE={profile.name}"
    missing = [
        (what, path)
        for what, path in profile.required_paths().items()
        if report.profile_paths.get(path) is False
    ]
    found = [
        Finding(host, "paths", False, f"{what} {path} is missing (profile {profile.name})", fix)
        for what, path in missing
    ]
    mpi = profile.openmpi
    have = report.openmpi_version
    if have and profiles.numbers(have)[0] != mpi.major:
        detail = f"{mpi.mpirun} is Open MPI {have}; profile {profile.name} launches with {mpi.major}'s flags"
        found.append(Finding(host, "paths", False, detail, fix))
    if not found and report.profile_paths:
        shown = ", ".join(f"{what} {path}" for what, path in profile.required_paths().items())
        detail = f"{shown}" + (f" (Open MPI {have})" if have else "")
        found.append(Finding(host, "paths", True, detail))
    return found
