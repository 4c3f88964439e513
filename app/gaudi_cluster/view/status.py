"""`gaudi-cluster status`: a running job's nodes and ranks, read from its master over a local socket.

The master serves a JSON snapshot on a Unix socket in the job's directory (`status.sock`, owner-only:
the directory is 0700 and the socket 0600); never over the network. The client finds the running
job (or the one named), asks once, and prints a table or the JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.rank import jobdir
from gaudi_cluster.view.jobview import render_table

SOCKET_NAME = jobdir.STATUS_SOCKET


class StatusServer:
    """Answers every connection with one JSON snapshot, then closes it."""

    def __init__(self, job_dir: Path, snapshot: Callable[[], dict[str, Any]]) -> None:
        jobdir.check_socket_room(job_dir.parent)
        self.path = job_dir / SOCKET_NAME
        self.path.unlink(missing_ok=True)
        self._snapshot = snapshot
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created 0600, never readable by others for an instant
        try:
            self._sock.bind(str(self.path))
        finally:
            os.umask(old)
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, name="status")

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall((json.dumps(self._snapshot()) + "\n").encode())

    def close(self) -> None:
        """Stop serving and wait for the thread (shutdown() wakes its accept(); close() alone would not)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.path.unlink(missing_ok=True)


def find_socket(job_root: Path, job_id: str | None) -> Path:
    """The named job's socket, or the newest job's that has one; one-line errors otherwise."""
    jobdir.check_socket_room(job_root)
    if job_id:
        path = jobdir.existing_job(job_root, job_id) / SOCKET_NAME
        if not path.exists():
            raise ClusterNotReady(f"job {job_id} is not running (it has no status socket); fix: see its logs")
        return path
    sockets = sorted(job_root.glob(f"*/{SOCKET_NAME}"), key=lambda p: p.stat().st_mtime)
    if not sockets:
        raise ClusterNotReady(
            f"no running job under {job_root}; fix: run this inside the master's container "
            "(docker exec <master> gaudi-cluster status) while a job runs"
        )
    return sockets[-1]


def fetch(path: Path, timeout_s: float = 5.0) -> dict[str, Any]:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except (ConnectionRefusedError, FileNotFoundError):
        raise ClusterNotReady(
            f"{path} is left from a master that is gone (nothing answers); fix: nothing runs now, "
            "or name the running job with --job-id"
        ) from None
    except OSError as error:
        raise ClusterNotReady(f"cannot read {path} ({error}); fix: run as the master's user") from None
    return json.loads(data)


def main(job_root: Path, job_id: str | None, as_json: bool, out: TextIO = sys.stdout) -> int:
    snapshot = fetch(find_socket(job_root, job_id))
    if as_json:
        out.write(json.dumps(snapshot, indent=2) + "\n")
        return 0
    out.write(f"job {snapshot['job']}: {snapshot['state']} · {snapshot['line']}\n\n")
    out.write(render_table(snapshot["ranks"]) + "\n")
    if snapshot.get("spares"):  # --spares: probed, idle, ready to take a lost node's place
        out.write(f"spares (idle, no ranks): {', '.join(snapshot['spares'])}\n")
    for line in snapshot.get("stragglers", []):
        out.write(f"\n{line}\n")
    return 0
