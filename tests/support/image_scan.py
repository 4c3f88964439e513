"""One pass over every layer of an image (`docker save`, streamed): what the no-key-baked-in tests check.

The old tests made two full passes per image (`docker export` of a container for the final filesystem's
names, then `docker save` written to a temporary file and read back, every file's whole content read into
memory). One streamed pass gives both: every name in every layer (a superset of the final filesystem's,
since a file there comes from some layer, so a key a later layer deletes still counts) and every text
file holding a private key. A file with a NUL in its first block is binary and skipped without reading
the rest (the rule was already "no NUL anywhere"), so torch's shared objects cost only their tar blocks.

Where the engine keeps its layers as overlay2 directories this process can read (the test machines and
CI: a local engine run as root), the scan walks those directories instead: they are what `docker save`
would tar, one per layer, without the 20-30 s the daemon spends writing 2 GB of tar. A deleted file is
then a whiteout (a 0/0 character device) rather than a `.wh.` name; the file itself stays in the layer
that added it, so a key a later layer deletes is still found.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# A PEM/OpenSSH private key block: the header, then base64 lines (binaries only hold the header string).
PRIVATE_KEY_PEM = re.compile(
    rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\r?\n(?:[A-Za-z0-9+/=:, -]*\r?\n)*?[A-Za-z0-9+/=]{40,}\r?\n"
)
FIRST_BLOCK = 64 * 1024


@dataclass
class LayerScan:
    """Every layer's member names (as `layer: name`) and the text files holding a private key."""

    layers: int = 0
    names: list[str] = field(default_factory=list)
    private_keys: list[str] = field(default_factory=list)

    def named(self, pattern: str) -> list[str]:
        """The `layer: name` entries whose name matches the regular expression."""
        found = re.compile(pattern)
        return [entry for entry in self.names if found.search(entry.split(": ", 1)[1])]


def holds_private_key(inner: tarfile.TarFile, member: tarfile.TarInfo) -> bool:
    """A text file (no NUL anywhere) with a PEM/OpenSSH private key block in it."""
    stream = inner.extractfile(member)
    return stream is not None and _is_private_key_text(stream)


def _is_private_key_text(stream: IO[bytes]) -> bool:
    data = stream.read(FIRST_BLOCK)
    if b"\0" in data:
        return False
    data += stream.read()
    return b"PRIVATE KEY" in data and b"\0" not in data and PRIVATE_KEY_PEM.search(data) is not None


def layer_dirs(image: str) -> list[Path] | None:
    """The image's overlay2 layer directories, bottom first, when every one of them is readable here;
    None otherwise (another storage driver, a remote engine, no permission)."""
    done = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, check=True)
    (info,) = json.loads(done.stdout)
    driver = info.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        return None
    data = driver.get("Data") or {}
    lower = [Path(d) for d in reversed(data.get("LowerDir", "").split(":")) if d]
    dirs = [*lower, Path(data.get("UpperDir", ""))]
    if len(dirs) != len(info["RootFS"]["Layers"]) or not all(os.access(d, os.R_OK | os.X_OK) for d in dirs):
        return None
    return dirs


def scan_dirs(dirs: list[Path]) -> LayerScan:
    scan = LayerScan(layers=len(dirs))
    for layer in dirs:
        label = layer.parent.name
        for top, subdirs, files in os.walk(layer):
            base = Path(top).relative_to(layer)
            scan.names.extend(f"{label}: {(base / name).as_posix()}" for name in subdirs)
            for name in files:
                member = (base / name).as_posix()
                scan.names.append(f"{label}: {member}")
                found = os.lstat(os.path.join(top, name))  # one stat; a symlink is not a file here
                if stat.S_ISREG(found.st_mode) and found.st_size > 0:
                    with open(os.path.join(top, name), "rb") as stream:
                        if _is_private_key_text(stream):
                            scan.private_keys.append(f"{label}: {member}")
    return scan


def scan_layers(image: str, timeout_s: float = 900) -> LayerScan:
    """Every layer of IMAGE: its overlay2 directories where readable, else `docker save` streamed once."""
    dirs = layer_dirs(image)
    if dirs is not None:
        scan = scan_dirs(dirs)
        assert any(scan.names), f"the layers of {image} hold no file"
        return scan
    scan = LayerScan()
    with subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
            for layer in outer:
                if not layer.name.endswith("layer.tar"):
                    continue
                scan.layers += 1
                body = outer.extractfile(layer)
                assert body is not None, layer.name
                with tarfile.open(fileobj=body, mode="r|") as inner:
                    for member in inner:
                        scan.names.append(f"{layer.name}: {member.name}")
                        if member.isfile() and member.size > 0 and holds_private_key(inner, member):
                            scan.private_keys.append(f"{layer.name}: {member.name}")
        proc.wait(timeout=timeout_s)
    assert proc.returncode == 0, f"docker save {image} failed (exit {proc.returncode})"
    assert scan.layers, f"docker save {image} produced no layers"
    return scan
