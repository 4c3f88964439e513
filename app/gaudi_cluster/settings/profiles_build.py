"""What `make image PROFILE=...` builds, rendered from a profile: the Dockerfile's build arguments, the
tags, the `docker build` command, the dry run's summary, and the docs' table. Pure.

A profile whose Habana DeepSpeed commit is not recorded (no snapshot showed one) builds only with a commit
given (`HABANA_DEEPSPEED_COMMIT`), which must start with the recorded prefix where there is one: the build
never installs whatever a branch head happens to be. A dry run renders the command anyway, and says so.
"""

from __future__ import annotations

import re

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.profiles import Matrix, Profile

_SHA = re.compile(r"[0-9a-f]{40}")


def deepspeed_ref(p: Profile, commit: str | None = None) -> tuple[str, str]:
    """(the git ref pip installs, the commit prefix the build insists on); "" prefix: unpinned."""
    ds = p.data["habana_deepspeed"]
    if commit:
        if not _SHA.fullmatch(commit):
            raise ConfigError(
                f"HABANA_DEEPSPEED_COMMIT={commit!r} is not a full commit SHA; fix: give 40 hex digits"
            )
        known = ds["commit"] or ds["commit_prefix"]
        if known and not (commit.startswith(known) or known.startswith(commit)):
            raise ConfigError(
                f"HABANA_DEEPSPEED_COMMIT={commit} is not the profile's {known} (branch {ds['branch']}); "
                "fix: drop it, or correct profiles.json"
            )
        return commit, commit
    if ds["commit"]:
        return ds["commit"], ds["commit"]
    return ds["branch"], ds["commit_prefix"] or ""


def unpinned_note(p: Profile, commit: str | None = None) -> str | None:
    """Why this build would install an unrecorded DeepSpeed commit, or None when it is pinned."""
    if deepspeed_ref(p, commit)[1]:
        return None
    ds = p.data["habana_deepspeed"]
    return f"HabanaAI/DeepSpeed {ds['branch']}: {ds['commit_note']}"


def build_args(p: Profile, version: str, git_rev: str, deepspeed_commit: str | None = None) -> dict[str, str]:
    """The Dockerfile's build arguments for a profile (see Dockerfile and image/*.sh)."""
    d = p.data
    ds = d["habana_deepspeed"]
    ref, prefix = deepspeed_ref(p, deepspeed_commit)
    fabric = p.libfabric
    return {
        "FLAVOR": "gaudi",
        "DS_ACCELERATOR": "hpu",
        "BASE_IMAGE": d["base_image"],
        "PROFILE": p.name,
        "SYNAPSE_VERSION": p.synapse_version,
        "PT_VERSION": d["pytorch"],
        "HABANA_TORCH_PLUGIN_VERSION": d["habana_torch_plugin"],
        "HABANA_DEEPSPEED_REF": ref,
        "HABANA_DEEPSPEED_COMMIT_PREFIX": prefix,
        # A glob where the fork's base version is not known: only the branch suffix is then checked.
        "HABANA_DEEPSPEED_VERSION": ds["version"] or f"*+hpu.synapse.v{ds['branch']}",
        "HCCL_OFI_WRAPPER_COMMIT": d["hccl_ofi_wrapper"]["commit"],
        "HCCL_OFI_WRAPPER_INTERFACE": d["hccl_ofi_wrapper"]["interface"],
        "OPENMPI_ROOT": p.openmpi.root,
        "OPENMPI_MAJOR": str(p.openmpi.major),
        "LIBFABRIC_ROOT": fabric.root,
        "LIBFABRIC_SOURCE": "build" if fabric.built else "base",
        "LIBFABRIC_VERSION": fabric.version or "",
        "LIBFABRIC_URL": fabric.url,
        "LIBFABRIC_SHA256": fabric.sha256,
        "LIBFABRIC_CONFIGURE": fabric.configure,
        "EFA_ROOT": p.efa_root or "",
        "PYTHON_PINS": " ".join(f"{name}=={pin}" for name, pin in d["python_pins"].items()),
        "VERSION": version,
        "GIT_REV": git_rev,
    }


def image_tags(p: Profile, image_name: str, version: str, git_rev: str) -> list[str]:
    return [f"{image_name}:{p.name}", f"{image_name}:{version}-{p.name}-{p.synapse_version}-{git_rev}"]


def docker_build_argv(
    p: Profile, image_name: str, version: str, git_rev: str, deepspeed_commit: str | None = None
) -> list[str]:
    argv = ["docker", "build"]
    for tag in image_tags(p, image_name, version, git_rev):
        argv += ["-t", tag]
    for name, value in build_args(p, version, git_rev, deepspeed_commit).items():
        argv += ["--build-arg", f"{name}={value}"]
    return [*argv, "."]


def summary(p: Profile, deepspeed_commit: str | None = None) -> list[str]:
    """The build in a few lines (base, release, fork, wheels, paths): what a dry run shows first."""
    d = p.data
    ds = d["habana_deepspeed"]
    ref, prefix = deepspeed_ref(p, deepspeed_commit)
    fork = (
        f"HabanaAI/DeepSpeed {ds['branch']} @ {ref}"
        if prefix
        else f"HabanaAI/DeepSpeed {ds['branch']} (UNPINNED)"
    )
    fabric, mpi = p.libfabric, p.openmpi
    built = (
        f"built {fabric.version} from {fabric.url} (sha256 {fabric.sha256[:12]}...)"
        if fabric.built
        else "the base's"
    )
    efa = d["efa"]
    return [
        f"profile  {p.name}: {d['hardware']} ({', '.join(p.generations)}; presets {', '.join(d['presets'])})",
        f"base     {d['base_image']}",
        f"release  Synapse {p.synapse_version}-{p.synapse_build}, PyTorch {d['pytorch']} "
        f"(habana-torch-plugin {d['habana_torch_plugin']}), Python {d['python']}, {d['os']}",
        f"fork     {fork}, version {ds['version'] or '*+hpu.synapse.v' + ds['branch']}",
        f"wheels   {' '.join(f'{k}=={v}' for k, v in d['python_pins'].items())}",
        f"openmpi  {mpi.root} (Open MPI {mpi.version or mpi.major}, the base's; "
        f"launch flags of Open MPI {mpi.major})",
        f"fabric   libfabric {fabric.root} ({built}); "
        f"hccl_ofi_wrapper {d['hccl_ofi_wrapper']['commit'][:12]} "
        f"({d['hccl_ofi_wrapper']['interface']})",
        f"efa      installer {efa['installer']}{' --minimal' if efa['minimal'] else ''}: "
        f"{efa['root'] or 'no EFA libraries in the image'}",
    ]


def markdown_table(matrix: Matrix) -> str:
    rows = [
        "| hardware | profile (`make image PROFILE=…`) | tag | preset | Synapse | PyTorch | "
        "Habana DeepSpeed | optimum-habana | transformers | Open MPI | libfabric |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in matrix.profiles.values():
        d = p.data
        ds = d["habana_deepspeed"]
        pin = ds["commit"] or ds["commit_prefix"]
        fork = f"{ds['branch']} @ `{pin[:8]}`" if pin else f"{ds['branch']} (unpinned)"
        presets = " or ".join(f"`{name}`" for name in d["presets"])
        fabric = p.libfabric
        fabric_cell = f"`{fabric.root}` ({'built' if fabric.built else 'EFA installer'})"
        rows.append(
            f"| {d['hardware']} | `{p.name}` | `gaudi-cluster:{p.name}` | {presets} | "
            f"{p.synapse_version}-{p.synapse_build} | {d['pytorch']} | {fork} | "
            f"{d['optimum_habana']['version']} | {d['python_pins']['transformers']} | "
            f"`{p.openmpi.root}` ({p.openmpi.major}) | {fabric_cell} |"
        )
    return "\n".join(rows)
