"""The gaudi image profiles: one pin set per Gaudi software release, read from profiles.json. Pure.

profiles.json is the single source of the gaudi flavor's versions and of where its image keeps Open MPI,
libfabric and the EFA libraries: `make image PROFILE=...` renders the `docker build` command from it
(`profiles_build`), the build passes those paths into the image's environment (LIBFABRIC_ROOT, MPI_ROOT,
which the rank presets read), the launchers take the flags of the profile's Open MPI from it, the image
records its profile in /opt/gaudi-cluster/PROFILE, the probe checks the profile's paths on every node and
the doctor compares each node's driver and card generation with the profile's release
(`nodes.checks`); `gaudi-cluster aws` takes the DL1 profile's release for its AMI. `profiles_check`
keeps a pin set internally consistent. The one file read here is profiles.json itself: package data, as
much a part of the code as this module.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster.errors import ConfigError

MATRIX_PATH = Path(__file__).with_name("profiles.json")
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
GENERATIONS = ("gaudi1", "gaudi2", "gaudi3")
GENERATION_NAMES = {"gaudi1": "first-generation Gaudi", "gaudi2": "Gaudi 2", "gaudi3": "Gaudi 3"}


@dataclass(frozen=True)
class OpenMpi:
    root: str
    major: int
    version: str | None

    @property
    def mpirun(self) -> str:
        return f"{self.root}/bin/mpirun"


@dataclass(frozen=True)
class Libfabric:
    root: str
    version: str | None
    built: bool  # built from source by the image (True) or the base image's own (False)
    url: str = ""
    sha256: str = ""
    configure: str = ""

    @property
    def library(self) -> str:
        return f"{self.root}/lib/libfabric.so.1"


@dataclass(frozen=True)
class OpenMpiDialect:
    """The launch flags of one Open MPI major version: ORTE (4) or PRRTE (5)."""

    major: int
    ssh_args: tuple[str, ...]  # the flag pair that takes the ssh agent's arguments
    oob_mca: str  # the flag that sets oob_tcp_if_include
    rank_by: str  # optimum-habana's round-robin ranking: core on 4, slot on 5 (core is gone)
    btl: tuple[str, ...]


@dataclass(frozen=True)
class Profile:
    name: str
    data: Mapping[str, Any]

    @property
    def synapse_version(self) -> str:
        return str(self.data["synapse"]["version"])

    @property
    def synapse_build(self) -> str:
        return str(self.data["synapse"]["build"])

    @property
    def synapse_release(self) -> str:
        """major.minor: what host driver and container must agree on."""
        return release(self.synapse_version)

    @property
    def generations(self) -> tuple[str, ...]:
        return tuple(self.data["generations"])

    @property
    def openmpi(self) -> OpenMpi:
        d = self.data["openmpi"]
        return OpenMpi(str(d["root"]), int(d["major"]), d.get("version"))

    @property
    def libfabric(self) -> Libfabric:
        d = self.data["libfabric"]
        built = d["from"] == "build"
        return Libfabric(
            str(d["root"]),
            d.get("version"),
            built,
            d.get("url", ""),
            d.get("sha256", ""),
            d.get("configure", ""),
        )

    @property
    def libfabric_root(self) -> str:
        return self.libfabric.root

    @property
    def efa_root(self) -> str | None:
        return self.data["efa"].get("root")

    def required_paths(self) -> dict[str, str]:
        """What every node running this profile's image must have, by what it is (the doctor's names)."""
        paths = {"Open MPI": self.openmpi.mpirun, "libfabric": self.libfabric.library}
        if self.efa_root:
            paths["EFA libraries"] = f"{self.efa_root}/lib"
        return paths

    def get(self, dotted: str) -> Any:
        value: Any = self.data
        for key in dotted.split("."):
            if not isinstance(value, Mapping) or key not in value:
                raise ConfigError(f"profile {self.name} has no '{dotted}'; fix: see {MATRIX_PATH.name}")
            value = value[key]
        return value


@dataclass(frozen=True)
class Matrix:
    default: str
    facts: Mapping[str, Any]
    profiles: Mapping[str, Profile]

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise ConfigError(
                f"profile '{name}' is unknown; fix: use one of {', '.join(self.profiles)} "
                "(e.g. make image PROFILE=dl1)"
            )
        return self.profiles[name]

    def generation_of(self, device_name: str | None) -> str | None:
        """The card generation of an hl-smi name (HL-205: first-gen, HL-225: Gaudi 2, HL-325L: Gaudi 3)."""
        name = (device_name or "").strip().upper()
        prefixes: Mapping[str, str] = self.facts["device_generations"]
        for prefix in sorted(prefixes, key=len, reverse=True):
            if name.startswith(prefix):
                return str(prefixes[prefix])
        return None

    def dialect(self, major: int) -> OpenMpiDialect:
        table: Mapping[str, Any] = self.facts["openmpi_dialects"]
        if str(major) not in table:
            raise ConfigError(
                f"Open MPI {major} is not supported; "
                f"fix: use Open MPI {' or '.join(sorted(table))} in the image"
            )
        d = table[str(major)]
        return OpenMpiDialect(
            major, tuple(d["ssh_args"]), str(d["oob_mca"]), str(d["rank_by"]), tuple(d["btl"])
        )

    @property
    def openmpi_majors(self) -> tuple[int, ...]:
        return tuple(sorted(int(major) for major in self.facts["openmpi_dialects"]))

    def pairs_with(self, profile: Profile, generation: str | None, driver_release: str) -> str | None:
        """Why this host driver release and this image cannot run together, or None when they can: the
        same release, or (Gaudi 2 only) adjacent releases, as Habana supports them."""
        if driver_release == profile.synapse_release:
            return None
        if generation in self.facts["mixed_driver_generations"] and adjacent(
            driver_release, profile.synapse_release
        ):
            return None
        if generation in self.facts["mixed_driver_generations"]:
            return "Habana supports a Gaudi 2 driver and container of adjacent releases only"
        return "Habana supports a driver and a container of different releases on Gaudi 2 only (adjacent)"

    def fitting_profiles(self, generation: str | None, driver_release: str) -> list[str]:
        """The profiles whose image this card generation and host driver release can run."""
        return [
            p.name
            for p in self.profiles.values()
            if (generation is None or generation in p.generations)
            and self.pairs_with(p, generation, driver_release) is None
        ]


def load(text: str | None = None) -> Matrix:
    raw = json.loads(MATRIX_PATH.read_text() if text is None else text)
    profiles = {name: Profile(name, data) for name, data in raw["profiles"].items()}
    return Matrix(raw["default"], raw["facts"], profiles)


@functools.cache
def matrix() -> Matrix:
    """The package's own matrix, read once per process."""
    return load()


def release(version: str) -> str:
    """'1.22.1-97ec1a4' or '1.22.0' -> '1.22'."""
    return ".".join(version.split("-", maxsplit=1)[0].split(".")[:2])


def numbers(version: str) -> tuple[int, ...]:
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"'{version}' is not a release number")
    return tuple(int(part) for part in match.group(0).split("."))


def adjacent(release_a: str, release_b: str) -> bool:
    """1.23 and 1.24 are adjacent; 1.22 and 1.24 are not."""
    a, b = numbers(release_a)[:2], numbers(release_b)[:2]
    return a[0] == b[0] and abs(a[1] - b[1]) == 1


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def satisfies(version: str, specifier: str) -> bool:
    """Whether a release number meets a PEP 440 specifier set of ==, !=, >=, <=, >, < and ~= clauses
    (release numbers only: enough for the ranges packages declare here)."""
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        op = next(o for o in ("~=", "==", "!=", ">=", "<=", ">", "<") if clause.startswith(o))
        have, want = _padded(numbers(version), numbers(clause[len(op) :].strip()))
        if op == "~=":
            prefix = numbers(clause[2:].strip())[:-1]
            ok = have >= want and numbers(version)[: len(prefix)] == prefix
        else:
            ok = {
                "==": have == want,
                "!=": have != want,
                ">=": have >= want,
                "<=": have <= want,
                ">": have > want,
                "<": have < want,
            }[op]
        if not ok:
            return False
    return True
