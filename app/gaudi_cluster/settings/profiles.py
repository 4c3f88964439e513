"""The gaudi image profiles: one pin set per Gaudi generation, read from profiles.json. Pure.

profiles.json is the single source of the gaudi flavor's versions: `make image PROFILE=...` renders the
`docker build` command (base image, build args, tags) from it, the image records its profile in
/opt/gaudi-cluster/PROFILE, the doctor compares each node's host driver with the profile's Synapse
release, `gaudi-cluster aws` takes the DL1 profile's release for its AMI, and docs/gaudi.md holds the
table rendered here. `consistency_problems` is what keeps a pin set internally consistent (Synapse <->
PyTorch <-> Habana's DeepSpeed branch <-> optimum-habana <-> the transformers range it declares).
The build and the docs read it through `profiles_cli`. The one file read here is profiles.json itself:
package data, as much a part of the code as this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_cluster.errors import ConfigError

MATRIX_PATH = Path(__file__).with_name("profiles.json")
# Where the image records which profile it was built from (one word); the probe reads it.
_SHA = re.compile(r"[0-9a-f]{40}")
_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
GENERATIONS = ("gaudi1", "gaudi2", "gaudi3")


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
    def libfabric_root(self) -> str:
        return str(self.data["libfabric_root"])

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
    facts: Mapping[str, str]
    profiles: Mapping[str, Profile]

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise ConfigError(
                f"profile '{name}' is unknown; fix: use one of {', '.join(self.profiles)} "
                "(e.g. make image PROFILE=dl1)"
            )
        return self.profiles[name]


def load(text: str | None = None) -> Matrix:
    raw = json.loads(MATRIX_PATH.read_text() if text is None else text)
    profiles = {name: Profile(name, data) for name, data in raw["profiles"].items()}
    return Matrix(raw["default"], raw["facts"], profiles)


def release(version: str) -> str:
    """'1.22.1-97ec1a4' or '1.22.0' -> '1.22'."""
    return ".".join(version.split("-", maxsplit=1)[0].split(".")[:2])


def _numbers(version: str) -> tuple[int, ...]:
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"'{version}' is not a release number")
    return tuple(int(part) for part in match.group(0).split("."))


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def satisfies(version: str, specifier: str) -> bool:
    """Whether a release number meets a PEP 440 specifier set of ==, !=, >=, <=, >, < and ~= clauses
    (release numbers only: enough for the ranges packages declare here)."""
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        op = next(o for o in ("~=", "==", "!=", ">=", "<=", ">", "<") if clause.startswith(o))
        have, want = _padded(_numbers(version), _numbers(clause[len(op) :].strip()))
        if op == "~=":
            prefix = _numbers(clause[2:].strip())[:-1]
            ok = have >= want and _numbers(version)[: len(prefix)] == prefix
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


def consistency_problems(matrix: Matrix) -> list[str]:
    """Every way a profile contradicts itself or the facts; empty when the matrix is consistent."""
    problems: list[str] = []
    if matrix.default not in matrix.profiles:
        problems.append(f"default profile '{matrix.default}' is not defined")
    for p in matrix.profiles.values():
        problems += [f"{p.name}: {problem}" for problem in _profile_problems(p, matrix.facts)]
    covered = {g for p in matrix.profiles.values() for g in p.data["generations"]}
    problems += [f"no profile runs {g}" for g in GENERATIONS if g not in covered]
    return problems


def _profile_problems(p: Profile, facts: Mapping[str, str]) -> list[str]:
    d = p.data
    found: list[str] = []
    version, build, pt, os_name = p.synapse_version, p.synapse_build, d["pytorch"], d["os"]
    expected_base = (
        f"vault.habana.ai/gaudi-docker/{version}/{os_name}/habanalabs/"
        f"pytorch-installer-{pt}:{version}-{build}"
    )
    if d["base_image"] != expected_base:
        found.append(f"base_image {d['base_image']} is not {expected_base}")
    if d["habana_torch_plugin"] != f"{version}.{build}":
        found.append(f"habana_torch_plugin {d['habana_torch_plugin']} is not {version}.{build}")
    ds = d["habana_deepspeed"]
    if ds["branch"] != version:
        found.append(f"habana_deepspeed branch {ds['branch']} is not the Synapse release {version}")
    if not ds["version"].endswith(f"+hpu.synapse.v{version}"):
        found.append(f"habana_deepspeed version {ds['version']} is not built for Synapse {version}")
    if ds["commit"] is not None and (
        not _SHA.fullmatch(ds["commit"]) or not ds["commit"].startswith(ds["commit_prefix"])
    ):
        found.append(
            f"habana_deepspeed commit {ds['commit']} is not a full SHA starting {ds['commit_prefix']}"
        )
    oh = d["optimum_habana"]
    if release(oh["validated_synapse"]) != p.synapse_release:
        found.append(f"optimum-habana {oh['version']} is validated with Synapse {oh['validated_synapse']}")
    if oh["deepspeed_branch"] != ds["branch"]:
        found.append(
            f"optimum-habana {oh['version']} asks for DeepSpeed {oh['deepspeed_branch']}, not {ds['branch']}"
        )
    pins = d["python_pins"]
    if pins.get("optimum-habana") != oh["version"]:
        found.append(f"python_pins optimum-habana {pins.get('optimum-habana')} is not {oh['version']}")
    for package, spec in oh["requires"].items():
        if package in pins and not satisfies(pins[package], spec):
            found.append(f"{package} {pins[package]} is outside optimum-habana {oh['version']}'s {spec}")
    if "transformers" not in pins:
        found.append("python_pins lacks transformers (optimum-habana patches one transformers minor)")
    wrapper = d["hccl_ofi_wrapper"]
    if not _SHA.fullmatch(wrapper["commit"]):
        found.append(f"hccl_ofi_wrapper commit {wrapper['commit']} is not a full SHA")
    if wrapper["interface"] not in ("destructor", "no-destructor"):
        found.append(f"hccl_ofi_wrapper interface '{wrapper['interface']}' is not (no-)destructor")
    wants_destructor = _numbers(version) >= _numbers(facts["ofi_wrapper_destructor_from_synapse"])
    if (wrapper["interface"] == "destructor") != wants_destructor:
        found.append(
            f"hccl_ofi_wrapper interface '{wrapper['interface']}' does not match HCCL {version} "
            f"(virtual destructor from {facts['ofi_wrapper_destructor_from_synapse']} on)"
        )
    if "gaudi1" in d["generations"] and _numbers(p.synapse_release) > _numbers(facts["gaudi1_last_synapse"]):
        found.append(
            f"Synapse {version} does not support first-gen Gaudi (last: {facts['gaudi1_last_synapse']}.x)"
        )
    return found


def build_args(p: Profile, version: str, git_rev: str) -> dict[str, str]:
    """The Dockerfile's build arguments for a profile (see Dockerfile and image/*.sh)."""
    d = p.data
    ds = d["habana_deepspeed"]
    return {
        "FLAVOR": "gaudi",
        "DS_ACCELERATOR": "hpu",
        "BASE_IMAGE": d["base_image"],
        "PROFILE": p.name,
        "SYNAPSE_VERSION": p.synapse_version,
        "PT_VERSION": d["pytorch"],
        "HABANA_TORCH_PLUGIN_VERSION": d["habana_torch_plugin"],
        # A branch name where no commit is pinned; the build then checks the commit prefix.
        "HABANA_DEEPSPEED_REF": ds["commit"] or ds["branch"],
        "HABANA_DEEPSPEED_COMMIT_PREFIX": ds["commit_prefix"],
        "HABANA_DEEPSPEED_VERSION": ds["version"],
        "HCCL_OFI_WRAPPER_COMMIT": d["hccl_ofi_wrapper"]["commit"],
        "HCCL_OFI_WRAPPER_INTERFACE": d["hccl_ofi_wrapper"]["interface"],
        "LIBFABRIC_ROOT": p.libfabric_root,
        "PYTHON_PINS": " ".join(f"{name}=={pin}" for name, pin in d["python_pins"].items()),
        "VERSION": version,
        "GIT_REV": git_rev,
    }


def image_tags(p: Profile, image_name: str, version: str, git_rev: str) -> list[str]:
    return [f"{image_name}:{p.name}", f"{image_name}:{version}-{p.name}-{p.synapse_version}-{git_rev}"]


def docker_build_argv(p: Profile, image_name: str, version: str, git_rev: str) -> list[str]:
    argv = ["docker", "build"]
    for tag in image_tags(p, image_name, version, git_rev):
        argv += ["-t", tag]
    for name, value in build_args(p, version, git_rev).items():
        argv += ["--build-arg", f"{name}={value}"]
    return [*argv, "."]


def markdown_table(matrix: Matrix) -> str:
    rows = [
        "| hardware | profile (`make image PROFILE=…`) | tag | preset | Synapse | PyTorch | "
        "Habana DeepSpeed | optimum-habana | transformers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in matrix.profiles.values():
        d = p.data
        ds = d["habana_deepspeed"]
        fork = f"{ds['branch']} @ `{(ds['commit'] or ds['commit_prefix'])[:8]}`"
        presets = " or ".join(f"`{name}`" for name in d["presets"])
        rows.append(
            f"| {d['hardware']} | `{p.name}` | `gaudi-cluster:{p.name}` | {presets} | "
            f"{p.synapse_version}-{p.synapse_build} | {d['pytorch']} | {fork} | "
            f"{d['optimum_habana']['version']} | {d['python_pins']['transformers']} |"
        )
    return "\n".join(rows)
