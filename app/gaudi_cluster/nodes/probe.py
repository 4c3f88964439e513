"""Node: what a node reports about itself. `python -m gaudi_cluster.nodes.probe --json` is what the
master runs on every node (over ssh, srun or here); `gaudi-cluster probe` is the same for a user.

Only cheap, read-only checks (no torch import: versions come from package metadata) so that
probing 32 nodes in parallel costs about one ssh round trip. Its own entry, not the CLI's: on every
node of every job, the CLI's parsers and the master's settings cost 10 of the probe's 62 ms (in the image).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gaudi_cluster.env import presets
from gaudi_cluster.errors import ConfigError, GaudiClusterError, error_line, exit_code_for, quoted
from gaudi_cluster.nodes import devices
from gaudi_cluster.rank import jobdir
from gaudi_cluster.settings import profiles
from gaudi_cluster.wire.kinds import AUTO, Accelerator
from gaudi_cluster.wire.node_report import Interface, NodeReport
from gaudi_cluster.wire.private_payload import PayloadBundle, PrivatePayload, PrivatePayloadError

PACKAGES = ("torch", "deepspeed", "transformers", "optimum-habana", "habana-torch-plugin")
BUILD_ID_FILE = Path("/opt/gaudi-cluster/BUILD_ID")
PROFILE_FILE = Path("/opt/gaudi-cluster/PROFILE")
HCCL_OFI_WRAPPER = "libhccl_ofi_wrapper.so"
HL_SMI_NAME = ("hl-smi", "-Q", "name", "-f", "csv,noheader")
_OPENMPI_VERSION = re.compile(r"Open MPI\)?\s+v?([0-9]+(?:\.[0-9]+)*)")


def image_profile(path: Path | None = None) -> str | None:
    """The profile this image was built from, or None (the cpu flavor has none)."""
    try:
        return (path or PROFILE_FILE).read_text().strip() or None
    except OSError:
        return None


def package_versions(paths: Sequence[str] | None = None) -> dict[str, str | None]:
    """The installed version of each of PACKAGES (None: not installed): the `Version:` header of the
    METADATA in its `NAME-VERSION.dist-info` directory, found by one listing of each import path, where
    importlib.metadata searches every path and parses the whole file per package (~25 ms of a probe,
    which runs on every node of every job). A distribution found some other way (an egg, a dist-info
    without a readable METADATA) is asked of importlib.metadata after all."""
    wanted = {_distribution_key(name): name for name in PACKAGES}
    versions: dict[str, str | None] = dict.fromkeys(PACKAGES)
    unsure: set[str] = set()
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for item in names:
            stem, dot, kind = item.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            name = wanted.get(_distribution_key(stem.partition("-")[0]))
            if name is None or versions[name] is not None:
                continue
            version = _header_version(Path(entry or ".", item, "METADATA")) if kind == "dist-info" else None
            if version:
                versions[name] = version
            else:
                unsure.add(name)
    for name in unsure - {name for name, version in versions.items() if version}:
        versions[name] = _metadata_version(name)
    return versions


def _header_version(metadata: Path) -> str | None:
    """The `Version:` of a METADATA file's headers (they end at the first blank line)."""
    try:
        with metadata.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if not line.strip():
                    return None
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        return None
    return None


def _distribution_key(name: str) -> str:
    """A distribution's name as packaging compares it (PEP 503): optimum_habana == optimum-habana."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata_version(name: str) -> str | None:
    import importlib.metadata  # here: email, zipfile and csv come with it, ~10 ms of an import

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def interfaces() -> list[Interface]:
    """Interfaces in kernel (ifindex) order with their IPv4 addresses, and the kernel driver of those
    backed by a device (a Gaudi NIC's is habanalabs)."""
    try:
        out = subprocess.run(
            ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
        found = [
            (entry["ifname"], tuple(a["local"] for a in entry.get("addr_info", [])))
            for entry in sorted(json.loads(out), key=lambda e: e.get("ifindex", 0))
        ]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
        found = [(name, ()) for name in names]
    driver_of = devices.sysfs_driver(devices.sysfs_root(os.environ))
    return [Interface(name, addresses, driver_of(f"class/net/{name}")) for name, addresses in found]


def route_ifname(address: str, local_interfaces: Sequence[Interface]) -> str | None:
    """The interface this node reaches ADDRESS (a name or an IPv4 address) through: `ip route get`."""
    try:
        ip = socket.getaddrinfo(address, None, socket.AF_INET)[0][4][0]
        out = subprocess.run(
            ["ip", "-j", "route", "get", str(ip)], capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, IndexError, subprocess.SubprocessError):
        return None
    return presets.route_ifname(out, str(ip), local_interfaces)


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def usable_cpus() -> int:
    """CPUs this node's processes may use: the affinity mask, capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def boot_id() -> str | None:
    """The kernel's id of this boot: containers on one server share it, separate servers never do."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _hccl_ofi_wrapper() -> str | None:
    dirs = [*os.environ.get("LD_LIBRARY_PATH", "").split(":"), "/usr/lib/habanalabs"]
    for directory in filter(None, dirs):
        candidate = Path(directory) / HCCL_OFI_WRAPPER
        if candidate.exists():
            return str(candidate)
    return None


def node_profile(name: str | None) -> profiles.Profile | None:
    """This image's profile from the package's matrix (None: the cpu flavor, or a name it does not know)."""
    matrix = profiles.matrix()
    return matrix.profiles.get(name) if name else None


def fabric_environ(environ: Mapping[str, str], profile: profiles.Profile | None) -> dict[str, str]:
    """The environment as this image's profile defines it: its libfabric and Open MPI (what the build set
    in the image's environment from the same profile; the profile wins if the two ever disagree)."""
    if profile is None:
        return dict(environ)
    return {**environ, "LIBFABRIC_ROOT": profile.libfabric_root, "MPI_ROOT": profile.openmpi.root}


def _fi_info(environ: Mapping[str, str]) -> str | None:
    """The image's libfabric's fi_info ($LIBFABRIC_ROOT/bin first, as the image's PATH has it)."""
    root = presets.libfabric_root(environ)
    own = Path(root) / "bin" / "fi_info" if root else None
    if own is not None and own.is_file():
        return str(own)
    return shutil.which("fi_info", path=environ.get("PATH"))


def profile_paths(profile: profiles.Profile | None) -> dict[str, bool]:
    """Whether each path the profile puts Open MPI, libfabric and EFA at exists here."""
    return {path: os.path.exists(path) for path in (profile.required_paths().values() if profile else ())}


def parse_openmpi_version(stdout: str) -> str | None:
    """'mpirun (Open MPI) 5.0.8' -> '5.0.8'."""
    match = _OPENMPI_VERSION.search(stdout or "")
    return match.group(1) if match else None


def openmpi_version(profile: profiles.Profile | None, environ: Mapping[str, str]) -> str | None:
    """The version of the profile's mpirun (else the one on PATH); None when there is none."""
    mpirun = profile.openmpi.mpirun if profile else shutil.which("mpirun", path=environ.get("PATH"))
    if not mpirun or not os.path.exists(mpirun):
        return None
    return parse_openmpi_version(devices.default_run([mpirun, "--version"], 10.0) or "")


def device_name() -> str | None:
    """hl-smi's name of this node's cards (one row per card, all alike): what tells the generation."""
    rows = [line.strip() for line in (devices.default_run(HL_SMI_NAME) or "").splitlines() if line.strip()]
    return rows[0] if rows else None


def parse_lscpu(stdout: str) -> tuple[int, int] | None:
    """(sockets, cores per socket) from `lscpu`, as optimum-habana's DistributedRunner reads them."""
    fields = dict(line.split(":", 1) for line in stdout.splitlines() if ":" in line)
    try:
        return int(fields["Socket(s)"].strip()), int(fields["Core(s) per socket"].strip())
    except (KeyError, ValueError):
        return None


def cpu_topology() -> tuple[int, int] | None:
    """This node's (sockets, cores per socket), or None when lscpu is missing or says neither."""
    return parse_lscpu(devices.default_run(["lscpu"], 10.0) or "")


def _existing_ancestor(path: str) -> str:
    """The output directory may not exist yet: its disk is the one of its nearest existing parent."""
    current = Path(path)
    while not current.exists() and current != current.parent:
        current = current.parent
    return str(current)


def fi_providers(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, bool | None]:
    """Whether `fi_info -p NAME` finds each provider, run with the ranks' LD_LIBRARY_PATH (so with the
    libfabric HCCL will load); None for every name when there is no fi_info."""
    fi_info = _fi_info(environ)
    env = {**environ, "LD_LIBRARY_PATH": presets.fabric_ld_library_path(environ)}
    found: dict[str, bool | None] = {}
    for name in names:
        if not fi_info:
            found[name] = None
            continue
        try:
            done = subprocess.run(
                [fi_info, "-p", name], capture_output=True, text=True, timeout=10, check=False, env=env
            )
            found[name] = done.returncode == 0 and devices.fi_info_has_provider(done.stdout, name)
        except (OSError, subprocess.SubprocessError):
            found[name] = False
    return found


def probe(
    paths: Sequence[str],
    accelerator: str,
    cpu_slots: int | None,
    check_efa: bool,
    output_dir: str | None = None,
    check_fabric: bool = False,
) -> NodeReport:
    """check_efa: run `fi_info -p efa` whatever the node; check_fabric: on an HPU node, also see which of
    the efa and verbs providers its libfabric offers (what `--env-preset auto` and hostnic need)."""
    profile_name = image_profile()
    profile = node_profile(profile_name)
    environ = fabric_environ(os.environ, profile)
    driver_of = devices.sysfs_driver(devices.sysfs_root(environ))
    kind = devices.detect_accelerator(environ, driver_of=driver_of) if accelerator == AUTO else accelerator
    wanted = ["efa"] if check_efa else []
    if check_fabric and kind == Accelerator.HPU:
        wanted = ["efa", "verbs"]
    return NodeReport(
        hostname=socket.gethostname(),
        python=sys.executable,
        accelerator=kind,
        slots=devices.detect_slots(kind, environ, cpu_slots=cpu_slots, driver_of=driver_of),
        versions=package_versions(),
        build_id=BUILD_ID_FILE.read_text().strip() if BUILD_ID_FILE.exists() else None,
        interfaces=tuple(interfaces()),
        paths={path: os.path.exists(path) for path in paths},
        output_dir=output_dir or os.getcwd(),
        free_disk_bytes=_free_bytes(_existing_ancestor(output_dir or os.getcwd())),
        free_shm_bytes=_free_bytes("/dev/shm"),
        uverbs_devices=tuple(sorted(glob.glob("/dev/infiniband/uverbs*"))),
        hccl_ofi_wrapper=_hccl_ofi_wrapper(),
        profile=profile_name,
        cpus=usable_cpus(),
        boot_id=boot_id(),
        driver_version=devices.driver_version(devices.default_run) if kind == Accelerator.HPU else None,
        fi_providers=fi_providers(wanted, environ) if wanted else {},
        device_name=device_name() if kind == Accelerator.HPU else None,
        profile_paths=profile_paths(profile),
        openmpi_version=openmpi_version(profile, environ) if profile else None,
    )


def run(
    paths: Sequence[str],
    accelerator: str,
    cpu_slots: int | None,
    check_efa: bool,
    stage_job: str | None,
    job_root: str,
    output_dir: str | None = None,
    check_fabric: bool = False,
    srun_task: bool = False,
) -> int:
    """`gaudi-cluster probe`: stage the job's directory (private payload on stdin) if asked, then report.

    `srun_task`: a task of the master's srun step (nodes/srun): its first line names this node, and
    stdin holds every node's payload, of which this node stages its own only."""
    from gaudi_cluster.nodes import srun  # the Slurm path's only (--srun-task)

    if srun_task:
        print(srun.NODE_LINE_PREFIX + os.environ.get(srun.NODE_NAME_VARIABLE, ""), flush=True)
    if stage_job:
        jobdir.check_job_id(stage_job, "--stage", Path(job_root))
        try:
            text = sys.stdin.read()
            if srun_task:
                bundle = PayloadBundle.from_json(text)
                payload = bundle.payloads[srun.pick_own(bundle.payloads, os.environ)]
            else:
                payload = PrivatePayload.from_json(text)
        except PrivatePayloadError as error:
            raise ConfigError(
                f"probe --stage: stdin is not the master's payload ({error}); fix: let the master run it"
            ) from None
        jobdir.stage(job_root, stage_job, payload)
    print(probe(paths, accelerator, cpu_slots, check_efa, output_dir, check_fabric).to_json())
    return 0


def parser(prog: str) -> argparse.ArgumentParser:
    from gaudi_cluster.settings.usage import OneLineParser, add_job_root_flag, examples

    probe_parser = OneLineParser(
        prog=prog,
        description=(
            "Print one JSON line describing this node: hostname, python, accelerator and slots, package "
            "versions, image build, interfaces, the given paths, free disk and shm, EFA devices. With "
            "--stage it also creates the job's directory and writes the private payload read from stdin."
        ),
        epilog=examples(f"{prog} --json", f"{prog} --accelerator hpu --path /w/run.py"),
    )
    probe_parser.add_argument("--json", action="store_true", help="print JSON (the only format)")
    probe_parser.add_argument(
        "--path", action="append", default=[], help="a path that must exist here; repeatable"
    )
    probe_parser.add_argument(
        "--accelerator", default=AUTO, choices=(AUTO, *Accelerator), help="device kind; default auto"
    )
    probe_parser.add_argument(
        "--slots", type=_slot_count, default=None, help="ranks per node on cpu; default 1"
    )
    probe_parser.add_argument("--check-efa", action="store_true", help="also run fi_info -p efa")
    probe_parser.add_argument(
        "--check-fabric",
        action="store_true",
        help="on an HPU node, also run fi_info -p efa and -p verbs (with the ranks' LD_LIBRARY_PATH)",
    )
    probe_parser.add_argument(
        "--stage", metavar="JOB_ID", help="create this job's directory, private file from stdin"
    )
    probe_parser.add_argument("--output-dir", help="report the free space where the job will write")
    probe_parser.add_argument(
        "--srun-task",
        action="store_true",
        help="a task of the master's srun step: name this node first; --stage takes its own payload",
    )
    add_job_root_flag(probe_parser)
    probe_parser.add_argument("-v", "--verbose", action="store_true", help="accepted as every command does")
    return probe_parser


def _slot_count(value: str) -> int:
    """--slots: a count, echoed quoted and cut when refused."""
    from gaudi_cluster.settings.host_names import MAX_SLOTS

    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is below 1")
    if number > MAX_SLOTS:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is above {MAX_SLOTS}")
    return number


def main(argv: Sequence[str] | None = None, prog: str = "python -m gaudi_cluster.nodes.probe") -> int:
    try:
        probe_parser = parser(prog)
        args, extra = probe_parser.parse_known_args(sys.argv[1:] if argv is None else argv)
        if extra:  # quoted as the CLI's other commands name them
            probe_parser.error(f"unrecognized arguments: {' '.join(quoted(word) for word in extra)}")
        job_root = args.job_root or ""  # read only to stage, and the master always names it then
        if args.stage and not job_root:
            from gaudi_cluster.settings.flags import resolve_setting  # flag > variable > default

            job_root = resolve_setting("job_root", None, os.environ)
        return run(
            args.path,
            args.accelerator,
            args.slots,
            args.check_efa,
            args.stage,
            job_root,
            args.output_dir,
            args.check_fabric,
            args.srun_task,
        )
    except GaudiClusterError as error:
        print(error_line(error), file=sys.stderr)
        return exit_code_for(error)


if __name__ == "__main__":
    sys.exit(main())
