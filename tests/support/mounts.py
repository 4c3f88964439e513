"""What a cluster test's containers mount: the user scripts (read-only) and a folder every rank may write."""

from __future__ import annotations

from pathlib import Path

USER_DIR = Path(__file__).resolve().parents[1] / "cluster" / "user"


def user_mounts(shared: Path) -> list[str]:
    """`docker run` arguments for /workspace/user (USER_DIR, read-only) and /workspace/shared (`shared`,
    opened to every uid: the ranks do not run as the test's user)."""
    shared.chmod(0o777)
    return ["-v", f"{USER_DIR}:/workspace/user:ro", "-v", f"{shared}:/workspace/shared"]
