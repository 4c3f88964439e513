"""Whether profiles.json contradicts itself: every link between a profile's pins, paths and the facts. Pure.

Synapse <-> base image tag <-> habana-torch-plugin; Habana's DeepSpeed branch <-> the one optimum-habana
installs <-> its version suffix; optimum-habana <-> the release it is validated for <-> the ranges it
declares <-> the pins; Open MPI's major <-> the release (5 from 1.23 on) <-> a known flag dialect;
libfabric's source <-> its prefix <-> the EFA installer's mode; the card generations <-> the release.
`make image` and `make lint` run it (`profiles_cli check`); one line per contradiction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gaudi_cluster.settings.profiles import GENERATIONS, Matrix, Profile, numbers, release, satisfies

_SHA = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[0-9a-f]{7,40}")


def consistency_problems(matrix: Matrix) -> list[str]:
    """Every way a profile contradicts itself or the facts; empty when the matrix is consistent."""
    problems: list[str] = []
    if matrix.default not in matrix.profiles:
        problems.append(f"default profile '{matrix.default}' is not defined")
    for p in matrix.profiles.values():
        found = [
            *_base_problems(p),
            *_deepspeed_problems(p),
            *_optimum_habana_problems(p),
            *_wrapper_problems(p, matrix.facts),
            *_path_problems(p, matrix),
            *_generation_problems(p, matrix.facts),
        ]
        problems += [f"{p.name}: {problem}" for problem in found]
    covered = {g for p in matrix.profiles.values() for g in p.generations}
    problems += [f"no profile runs {g}" for g in GENERATIONS if g not in covered]
    return problems


def _base_problems(p: Profile) -> list[str]:
    d = p.data
    found: list[str] = []
    version, build, pt, os_name = p.synapse_version, p.synapse_build, d["pytorch"], d["os"]
    repo = f"vault.habana.ai/gaudi-docker/{version}/{os_name}/habanalabs"
    expected = f"{repo}/pytorch-installer-{pt}:{version}-{build}"
    if d["base_image"] != expected:
        found.append(f"base_image {d['base_image']} is not {expected}")
    if d["habana_torch_plugin"] != f"{version}.{build}":
        found.append(f"habana_torch_plugin {d['habana_torch_plugin']} is not {version}.{build}")
    return found


def _deepspeed_problems(p: Profile) -> list[str]:
    ds = p.data["habana_deepspeed"]
    found: list[str] = []
    branch = ds["branch"]
    if numbers(release(branch)) > numbers(p.synapse_release):
        found.append(
            f"habana_deepspeed branch {branch} is newer than the Synapse release {p.synapse_version}"
        )
    if ds["version"] is not None and not ds["version"].endswith(f"+hpu.synapse.v{branch}"):
        found.append(f"habana_deepspeed version {ds['version']} is not built from branch {branch}")
    commit, prefix = ds["commit"], ds["commit_prefix"]
    if commit is not None and not _SHA.fullmatch(commit):
        found.append(f"habana_deepspeed commit {commit} is not a full SHA")
    if prefix is not None and not _PREFIX.fullmatch(prefix):
        found.append(f"habana_deepspeed commit_prefix {prefix} is not a hex commit prefix")
    if commit is not None and prefix is not None and not commit.startswith(prefix):
        found.append(f"habana_deepspeed commit {commit} does not start with its prefix {prefix}")
    if commit is None and not ds.get("commit_note"):
        found.append("habana_deepspeed has no commit and no commit_note saying why")
    return found


def _optimum_habana_problems(p: Profile) -> list[str]:
    d = p.data
    oh, ds, pins = d["optimum_habana"], d["habana_deepspeed"], d["python_pins"]
    found: list[str] = []
    if release(oh["validated_synapse"]) != p.synapse_release:
        found.append(f"optimum-habana {oh['version']} is validated with Synapse {oh['validated_synapse']}")
    if oh["deepspeed_branch"] != ds["branch"]:
        found.append(
            f"optimum-habana {oh['version']} asks for DeepSpeed {oh['deepspeed_branch']}, not {ds['branch']}"
        )
    if pins.get("optimum-habana") != oh["version"]:
        found.append(f"python_pins optimum-habana {pins.get('optimum-habana')} is not {oh['version']}")
    for package, spec in oh["requires"].items():
        if package in pins and not satisfies(pins[package], spec):
            found.append(f"{package} {pins[package]} is outside optimum-habana {oh['version']}'s {spec}")
    if "transformers" not in pins:
        found.append("python_pins lacks transformers (optimum-habana patches one transformers minor)")
    if "prometheus_client" not in d.get("control_plane_pins", {}):
        found.append("control_plane_pins lacks prometheus_client (the master's METRICS_PORT, k8s/base)")
    return found


def _wrapper_problems(p: Profile, facts: Mapping[str, Any]) -> list[str]:
    wrapper = p.data["hccl_ofi_wrapper"]
    found: list[str] = []
    if not _SHA.fullmatch(wrapper["commit"]):
        found.append(f"hccl_ofi_wrapper commit {wrapper['commit']} is not a full SHA")
    if wrapper["interface"] not in ("destructor", "no-destructor"):
        found.append(f"hccl_ofi_wrapper interface '{wrapper['interface']}' is not (no-)destructor")
    wants_destructor = numbers(p.synapse_version) >= numbers(facts["ofi_wrapper_destructor_from_synapse"])
    if (wrapper["interface"] == "destructor") != wants_destructor:
        found.append(
            f"hccl_ofi_wrapper interface '{wrapper['interface']}' does not match HCCL {p.synapse_version} "
            f"(virtual destructor from {facts['ofi_wrapper_destructor_from_synapse']} on)"
        )
    return found


def _path_problems(p: Profile, matrix: Matrix) -> list[str]:
    found: list[str] = []
    mpi, fabric, efa = p.openmpi, p.libfabric, p.data["efa"]
    wants_five = numbers(p.synapse_release) >= numbers(matrix.facts["openmpi5_from_synapse"])
    if (mpi.major == 5) != wants_five:
        found.append(
            f"Open MPI {mpi.major} does not match Synapse {p.synapse_version} "
            f"(Open MPI 5 from {matrix.facts['openmpi5_from_synapse']} on)"
        )
    if mpi.major not in matrix.openmpi_majors:
        found.append(f"Open MPI {mpi.major} has no flag dialect in facts.openmpi_dialects")
    if mpi.version is not None and numbers(mpi.version)[0] != mpi.major:
        found.append(f"Open MPI version {mpi.version} is not major {mpi.major}")
    if mpi.version is not None and not mpi.root.endswith(mpi.version):
        found.append(f"Open MPI root {mpi.root} does not name its version {mpi.version}")
    for what, root in (("Open MPI", mpi.root), ("libfabric", fabric.root), ("EFA", efa.get("root"))):
        if root is not None and not root.startswith("/"):
            found.append(f"{what} root {root} is not absolute")
    if fabric.built:
        if not (fabric.version and fabric.root.endswith(f"libfabric-{fabric.version}")):
            found.append(f"libfabric root {fabric.root} does not name the version built ({fabric.version})")
        if not _SHA256.fullmatch(fabric.sha256) or not fabric.url.endswith(
            f"libfabric-{fabric.version}.tar.bz2"
        ):
            found.append(f"libfabric {fabric.version} to build needs its release tarball url and sha256")
    elif efa.get("minimal") or fabric.root != efa.get("root"):
        found.append(
            "libfabric 'from base' must be the base's full EFA installation (efa.root, not --minimal)"
        )
    if "efa" in p.data["presets"] and not efa.get("root"):
        found.append("the efa preset needs the EFA libraries (efa.root)")
    return found


def _generation_problems(p: Profile, facts: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    unknown = [g for g in p.generations if g not in GENERATIONS]
    if unknown:
        found.append(f"unknown generations {unknown}; valid: {', '.join(GENERATIONS)}")
    if "gaudi1" in p.generations and numbers(p.synapse_release) > numbers(facts["gaudi1_last_synapse"]):
        found.append(
            f"Synapse {p.synapse_version} does not support first-gen Gaudi "
            f"(last: {facts['gaudi1_last_synapse']}.x)"
        )
    return found
