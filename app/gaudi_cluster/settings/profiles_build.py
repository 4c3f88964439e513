"""What `make image PROFILE=...` builds, rendered from a profile: the Dockerfile's build arguments, the
tags, the `docker build` command, the dry run's summary, and the docs' table. Pure.

The Habana DeepSpeed fork is always installed by a full commit: the one given (`HABANA_DEEPSPEED_COMMIT`,
which must start with the recorded prefix where there is one), the profile's, or the one `make image`
resolved from the branch (`fork_pin`). A dry run resolves nothing: it renders the branch and says how the
build will resolve and record it.
"""

from __future__ import annotations

import re

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.profiles import Matrix, Profile, matrix

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


def image_pins(p: Profile) -> dict[str, str]:
    """What the image installs on top of Habana's PyTorch: optimum-habana's stack (python_pins) and what
    the control plane itself imports (control_plane_pins: prometheus_client for --metrics-port)."""
    return {**p.data["python_pins"], **p.data["control_plane_pins"]}


def build_args(
    p: Profile, version: str, git_rev: str, deepspeed_commit: str | None = None, deepspeed_repo: str = ""
) -> dict[str, str]:
    """The Dockerfile's build arguments for a profile (see Dockerfile and image/*.sh)."""
    d = p.data
    wrapper = d["hccl_ofi_wrapper"]
    facts = matrix().facts
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
        "HABANA_DEEPSPEED_REPO": deepspeed_repo or facts["deepspeed_fork_repo"],
        "HABANA_DEEPSPEED_REF": ref,
        "HABANA_DEEPSPEED_COMMIT_PREFIX": prefix,
        # A glob where the fork's base version is not known: only the branch suffix is then checked.
        "HABANA_DEEPSPEED_VERSION": ds["version"] or f"*+hpu.synapse.v{ds['branch']}",
        "HCCL_OFI_WRAPPER_COMMIT": wrapper["commit"],
        "HCCL_OFI_WRAPPER_INTERFACE": wrapper["interface"],
        "HCCL_OFI_WRAPPER_URL": f"{facts['ofi_wrapper_repo']}/archive/{wrapper['commit']}.tar.gz",
        "OPENMPI_ROOT": p.openmpi.root,
        "OPENMPI_MAJOR": str(p.openmpi.major),
        "LIBFABRIC_ROOT": fabric.root,
        "LIBFABRIC_SOURCE": "build" if fabric.built else "base",
        "LIBFABRIC_VERSION": fabric.version or "",
        "LIBFABRIC_URL": fabric.url,
        "LIBFABRIC_SHA256": fabric.sha256,
        "LIBFABRIC_CONFIGURE": fabric.configure,
        "EFA_ROOT": p.efa_root or "",
        "PYTHON_PINS": " ".join(f"{name}=={pin}" for name, pin in image_pins(p).items()),
        "VERSION": version,
        "GIT_REV": git_rev,
    }


def image_tags(p: Profile, image_name: str, version: str, git_rev: str) -> list[str]:
    return [f"{image_name}:{p.name}", f"{image_name}:{version}-{p.name}-{p.synapse_version}-{git_rev}"]


def docker_build_argv(
    p: Profile,
    image_name: str,
    version: str,
    git_rev: str,
    deepspeed_commit: str | None = None,
    deepspeed_repo: str = "",
    overrides: dict[str, str] | None = None,
) -> list[str]:
    """`docker build` of the profile; overrides replace rendered build arguments (a stand-in base's paths)."""
    args = build_args(p, version, git_rev, deepspeed_commit, deepspeed_repo)
    for name, value in (overrides or {}).items():
        if name not in args:
            raise ConfigError(
                f"--set {name}: not a build argument of the profile; fix: one of {', '.join(args)}"
            )
        args[name] = value
    argv = ["docker", "build"]
    for tag in image_tags(p, image_name, version, git_rev):
        argv += ["-t", tag]
    for name, value in args.items():
        argv += ["--build-arg", f"{name}={value}"]
    return [*argv, "."]


def summary(p: Profile, deepspeed_commit: str | None = None, fork_how: str = "") -> list[str]:
    """The build in a few lines (base, release, fork, wheels, paths): what a dry run shows first."""
    d = p.data
    ds = d["habana_deepspeed"]
    ref = deepspeed_ref(p, deepspeed_commit)[0]
    fork = f"HabanaAI/DeepSpeed {ds['branch']}" + (f": {fork_how}" if fork_how else f" @ {ref}")
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
        f"wheels   {' '.join(f'{k}=={v}' for k, v in image_pins(p).items())}",
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
        fork = f"{ds['branch']} @ `{pin[:8]}`" if pin else f"{ds['branch']} (head, recorded per build)"
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
