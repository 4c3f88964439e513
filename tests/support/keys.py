"""Checks on key files made at test time. No key, real or fake, is written in the repository: a PEM
header in a source file reads as a committed private key to every secret scanner."""

from __future__ import annotations


def pem_label(data: bytes) -> str:
    """The label of the PEM block that `data` starts with ('EC PRIVATE KEY' for an SEC 1 key)."""
    first = data.split(b"\n", 1)[0].decode(errors="replace")
    return first.removeprefix("-----BEGIN ").removesuffix("-----")
