"""The gaudi image's build-time checks, run here on stand-ins: the hccl_ofi_wrapper ABI check against
two libraries compiled the two ways the wrapper's interface has been written, and the removal of the
base image's sshd line from root's .bashrc."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "image" / "check-hccl-ofi-wrapper.sh"

# The shape of hccl_ofi_wrapper: an interface class, its implementation ofi_plugin, and the two C entry
# points HCCL dlsym()s. DESTRUCTOR is what HCCL >= 1.19's copy of the interface declares first.
WRAPPER_SOURCE = """
#include <memory>
class ofi_plugin_interface {
public:
    DESTRUCTOR
    virtual int initialize() = 0;
};
class ofi_plugin : public ofi_plugin_interface {
public:
    int initialize() override { return 0; }
};
extern "C" double get_version() { return 1.2; }
extern "C" std::unique_ptr<ofi_plugin_interface>* create_ofi_plugin_handle() {
    return new std::unique_ptr<ofi_plugin_interface>(new ofi_plugin());
}
"""


def build(tmp: Path, name: str, destructor: str, optimize: str) -> Path:
    source = tmp / f"{name}.cpp"
    source.write_text(WRAPPER_SOURCE.replace("DESTRUCTOR", destructor))
    lib = tmp / f"{name}.so"
    subprocess.run(["g++", optimize, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return lib


def check(lib: Path, interface: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CHECK), str(lib), interface], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("optimize", ["-O0", "-O2"])  # the wrapper's Makefile builds at -O0
def test_the_abi_check_tells_the_two_interfaces_apart(tmp_path, optimize):
    new = build(tmp_path, "new", "virtual ~ofi_plugin_interface() = default;", optimize)
    old = build(tmp_path, "old", "", optimize)
    assert check(new, "destructor").returncode == 0
    assert check(old, "no-destructor").returncode == 0
    wrong = check(old, "destructor")
    assert wrong.returncode == 1
    assert "has no virtual destructor in ofi_plugin (_ZN10ofi_pluginD0Ev)" in wrong.stderr
    assert "fix: pin an hccl_ofi_wrapper commit" in wrong.stderr
    assert check(new, "no-destructor").returncode == 1


def test_the_abi_check_refuses_a_library_that_is_not_the_wrapper(tmp_path):
    source = tmp_path / "other.c"
    source.write_text("int something(void) { return 1; }\n")
    lib = tmp_path / "other.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    done = check(lib, "destructor")
    assert done.returncode == 1 and "does not export create_ofi_plugin_handle" in done.stderr
    assert check(tmp_path / "missing.so", "destructor").returncode == 1


# The tail of root's .bashrc in Habana's pytorch-installer images (1.21 and 1.22): the base layer appends
# the sshd line and comments out the interactivity guard, the PyTorch layer sources habanalabs.sh.
HABANA_BASHRC_TAIL = """# ~/.bashrc: executed by bash(1) for non-login shells.
#[ -z "$PS1" ] && return
alias ll='ls -alF'
/etc/init.d/ssh start "-p 3022"
source /etc/profile.d/habanalabs.sh
"""


def test_the_sshd_line_leaves_bashrc_and_the_habanalabs_profile_stays(tmp_path):
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text(HABANA_BASHRC_TAIL)
    done = subprocess.run(
        ["bash", "-c", f'source "{ROOT / "image" / "install-system.sh"}" && remove_bashrc_sshd'],
        env={"BASHRC": str(bashrc), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert bashrc.read_text() == HABANA_BASHRC_TAIL.replace('/etc/init.d/ssh start "-p 3022"\n', "")


def test_a_bashrc_that_still_starts_sshd_fails_the_build(tmp_path):
    bashrc = tmp_path / ".bashrc"
    bashrc.write_text('echo hi; /etc/init.d/ssh start "-p 3022"\n')
    done = subprocess.run(
        ["bash", "-c", f'source "{ROOT / "image" / "install-system.sh"}" && remove_bashrc_sshd'],
        env={"BASHRC": str(bashrc), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "still starts sshd" in done.stderr


def fake_openmpi(tmp_path: Path, version: str) -> Path:
    root = tmp_path / f"openmpi-{version}"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "mpirun").write_text(f"#!/bin/sh\necho 'mpirun (Open MPI) {version}'\n")
    (root / "bin" / "mpirun").chmod(0o755)
    return root


def system_step(function: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'source "{ROOT / "image" / "install-system.sh"}" && {function}'],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_bases_open_mpi_must_be_where_and_what_the_profile_says(tmp_path):
    five = fake_openmpi(tmp_path, "5.0.8")
    ok = system_step(
        "check_openmpi", {"MPI_ROOT": str(five), "OPENMPI_ROOT": str(five), "OPENMPI_MAJOR": "5"}
    )
    assert ok.returncode == 0 and "Open MPI 5.0.8" in ok.stderr
    moved = system_step(
        "check_openmpi", {"MPI_ROOT": "/opt/elsewhere", "OPENMPI_ROOT": str(five), "OPENMPI_MAJOR": "5"}
    )
    assert moved.returncode == 1 and f"the profile says Open MPI is in {five}" in moved.stderr
    four = fake_openmpi(tmp_path, "4.1.6")
    old = system_step(
        "check_openmpi", {"MPI_ROOT": str(four), "OPENMPI_ROOT": str(four), "OPENMPI_MAJOR": "5"}
    )
    assert old.returncode == 1 and "is Open MPI '4.1.6', the profile says major 5" in old.stderr


def test_a_libfabric_tarball_with_another_checksum_is_refused(tmp_path):
    tarball = tmp_path / "libfabric-1.22.0.tar.bz2"
    tarball.write_bytes(b"not the release")
    done = subprocess.run(
        ["bash", str(ROOT / "image" / "build-libfabric.sh")],
        env={
            "PATH": "/usr/bin:/bin",
            "LIBFABRIC_ROOT": str(tmp_path / "libfabric-1.22.0"),
            "LIBFABRIC_VERSION": "1.22.0",
            "LIBFABRIC_URL": tarball.as_uri(),
            "LIBFABRIC_SHA256": "0" * 64,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    # Refused before anything is installed or built (the verbs headers come after the checksum).
    assert done.returncode == 1, done.stderr
    assert "the profile records " + "0" * 64 in done.stderr
    assert not (tmp_path / "libfabric-1.22.0").exists()


# --- no host key in any layer ---------------------------------------------------------------------------

SYSTEM = ROOT / "image" / "install-system.sh"


def function_body(script: Path, name: str) -> str:
    """The function as bash itself reads it (the script is sourceable: it defines and runs nothing)."""
    done = subprocess.run(
        ["bash", "-c", f'source "$1" && declare -f {name}', "body", str(script)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_the_layer_that_installs_sshd_removes_the_host_keys_it_made():
    """openssh-server's install makes host keys; a layer holding them would give every container of the
    image the same host key. The one RUN that installs it (install-system.sh) removes them at its end,
    in the same layer, and no other step of the build makes or copies one."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    runs = [line for line in dockerfile.splitlines() if line.startswith("RUN ")]
    assert [run for run in runs if "install-system.sh" in run] == [
        'RUN bash /opt/gaudi-cluster/image/install-system.sh "${FLAVOR}"'
    ]
    main = function_body(SYSTEM, "main")
    assert main.index("install_cpu") < main.index("common_layout")
    assert main.index("install_gaudi") < main.index("common_layout")
    assert "rm -f /etc/ssh/ssh_host_*" in function_body(SYSTEM, "common_layout")
    # Nothing else in the build installs sshd or makes a key.
    for script in sorted((ROOT / "image").glob("*.sh")):
        text = script.read_text()
        assert "ssh-keygen" not in text, script
        assert script == SYSTEM or "openssh-server" not in text, script
    assert "ssh-keygen" not in dockerfile and "openssh-server" not in dockerfile
    # What the build copies in (entrypoint/, app/, image/, requirements/) holds no key file.
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    copied = [
        p for p in tracked.stdout.split() if p.split("/")[0] in ("entrypoint", "app", "image", "requirements")
    ]
    assert not [p for p in copied if Path(p).name.startswith(("ssh_host_", "id_ed25519", "id_rsa"))]
    assert not [
        p for p in copied if (ROOT / p).is_file() and (ROOT / p).read_bytes().startswith(b"-----BEGIN")
    ]
