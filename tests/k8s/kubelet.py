"""What the kubelet and the controllers make of a pod spec, imitated with files and `docker run` flags:
Secret and projected volumes laid out behind `..data` symlinks, the MPI Operator's Secret, our host
key Secrets, and a container's security settings as Docker's options."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.support.keys import pem_label

# Files of a Secret, by key.
SecretData = dict[str, bytes]
# The MPI Operator's Secret keys, and the files it mounts them as at sshAuthMountPath (every pod).
OPERATOR_ITEMS = {
    "id_rsa": "ssh-privatekey",
    "id_rsa.pub": "ssh-publickey",
    "authorized_keys": "ssh-publickey",
}


def secret_volume(directory: Path, files: dict[str, bytes], mode: int) -> Path:
    """A directory laid out as the kubelet lays out a Secret volume: files behind ..data symlinks."""
    timestamped = directory / "..2026_11_30_12_00_00.000000001"
    timestamped.mkdir(parents=True)
    for name, content in files.items():
        (timestamped / name).write_bytes(content)
        (timestamped / name).chmod(mode)
    (directory / "..data").symlink_to(timestamped.name)
    for name in files:
        (directory / name).symlink_to(f"..data/{name}")
    return directory


def projected_volume(directory: Path, projected: dict[str, Any], secrets: dict[str, SecretData]) -> Path:
    """A projected volume of Secrets as the manifest writes it: each source's items (key -> path), or
    every key of the Secret when it lists none, all with the volume's defaultMode."""
    files: dict[str, bytes] = {}
    for source in projected["sources"]:
        secret = source["secret"]
        data = secrets[secret["name"]]
        items = secret.get("items") or [{"key": key, "path": key} for key in data]
        for item in items:
            assert "mode" not in item, "per-item modes are not imitated"
            files[item["path"]] = data[item["key"]]
    return secret_volume(directory, files, projected["defaultMode"])


def security_flags(pod_spec: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """`docker run` options for the pod's and the container's securityContext. RuntimeDefault is
    Docker's default seccomp profile, so it needs no option; anything not imitated fails loudly."""
    pod = pod_spec.get("securityContext", {})
    own = container.get("securityContext", {})
    assert pod.get("seccompProfile", {"type": "RuntimeDefault"}) == {"type": "RuntimeDefault"}
    assert not set(pod) - {"seccompProfile", "sysctls"}, pod
    assert not set(own) - {"allowPrivilegeEscalation", "capabilities", "readOnlyRootFilesystem"}, own
    flags = [f"--sysctl={sysctl['name']}={sysctl['value']}" for sysctl in pod.get("sysctls", [])]
    if own.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    flags += [f"--cap-drop={cap}" for cap in own.get("capabilities", {}).get("drop", [])]
    flags += [f"--cap-add={cap}" for cap in own.get("capabilities", {}).get("add", [])]
    if own.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    return flags


def volume_mounts(container: dict[str, Any], directories: dict[str, Path]) -> list[str]:
    """`-v` specs for the container's volumeMounts, each volume given as a directory on this machine."""
    return [
        f"{directories[mount['name']]}:{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"
        for mount in container.get("volumeMounts", [])
        if mount["name"] in directories
    ]


def key_blob(line: bytes | str) -> str:
    """The base64 key of an ssh public key line (`type key [comment]`, or ssh-keyscan's `host type key`)."""
    fields = line.decode() if isinstance(line, bytes) else line
    parts = fields.split()
    return parts[2] if not parts[0].startswith(("ssh-", "ecdsa-")) else parts[1]


def operator_secret(directory: Path) -> dict[str, bytes]:
    """What the MPI Operator puts in its Secret <job>-ssh: an ECDSA P-521 key in PEM (SEC 1) form as
    ssh-privatekey, and the public key, without a comment, as ssh-publickey."""
    directory.mkdir()
    key = directory / "key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-C", "", "-f", str(key)],
        check=True,
    )
    private = key.read_bytes()
    assert pem_label(private) == "EC PRIVATE KEY"
    public = b" ".join(key.with_suffix(".pub").read_bytes().split()[:2]) + b"\n"
    return {"ssh-privatekey": private, "ssh-publickey": public}
