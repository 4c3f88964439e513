"""Checks on key files made at test time. No key, real or fake, is written in the repository: a PEM
header in a source file reads as a committed private key to every secret scanner."""

from __future__ import annotations

import subprocess
from pathlib import Path


def pem_label(data: bytes) -> str:
    """The label of the PEM block that `data` starts with ('EC PRIVATE KEY' for an SEC 1 key)."""
    first = data.split(b"\n", 1)[0].decode(errors="replace")
    return first.removeprefix("-----BEGIN ").removesuffix("-----")


def principals(cert: bytes | Path) -> list[str]:
    """The principals of an OpenSSH certificate (its bytes or its file), as `ssh-keygen -L` lists them."""
    data = cert.read_bytes() if isinstance(cert, Path) else cert
    shown = subprocess.run(["ssh-keygen", "-L", "-f", "-"], input=data, capture_output=True, check=True)
    lines = shown.stdout.decode().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Principals:"))
    end = next(i for i, line in enumerate(lines) if line.strip().startswith("Critical Options:"))
    return [line.strip() for line in lines[start + 1 : end] if line.strip()]
