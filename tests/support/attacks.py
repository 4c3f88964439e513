"""What an attacker on the training network sends to a master's control port (for the security tests).

Run as a script inside a container, or imported by tests on the host:
    python attacks.py HOST PORT JOB_ID [--flood]
Prints one JSON line: what each attack got back.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def _send(sock: socket.socket, message: object) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the master hung up on us (after whatever it sent)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except OSError:
        return True


def forged_exit(host: str, port: int, job: str) -> bool:
    """The attack that used to stop a whole job: hello as rank 1, then exit 1."""
    with socket.create_connection((host, port), timeout=10) as sock:
        _send(sock, {"type": "hello", "job": job, "host": "intruder", "rank": 1, "pid": 1})
        _send(sock, {"type": "exit", "code": 1, "signal": None, "tail": ["forged"]})
        return _closed_within(sock, 10)


def garbage(host: str, port: int, job: str, count: int = 50) -> int:
    """Random bytes, wrong types and a forged stop; returns how many connections were dropped."""
    dropped = 0
    payloads = [
        os.urandom(512) + b"\n",
        b"{not json\n",
        b'{"type": "beat", "step": "x"}\n',
        b'{"type": "stop"}\n',
    ]
    for i in range(count):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(payloads[i % len(payloads)])
            dropped += _closed_within(sock, 10)
    return dropped


def huge_line(host: str, port: int, megabytes: int = 10) -> bool:
    with socket.create_connection((host, port), timeout=10) as sock:
        chunk = b"A" * (1 << 20)
        try:
            for _ in range(megabytes):
                sock.sendall(chunk)
        except OSError:
            return True  # the master hung up before we finished: that is the point
        return _closed_within(sock, 10)


def half_open(host: str, port: int, count: int) -> int:
    """Open many connections and say nothing; returns how many the master accepted at once."""
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection((host, port), timeout=5))
        except OSError:
            break
    time.sleep(1)
    for sock in held:
        sock.close()
    return len(held)


def main(argv: list[str]) -> int:
    host, port, job = argv[0], int(argv[1]), argv[2]
    report = {"forged_exit_closed": forged_exit(host, port, job), "garbage_dropped": garbage(host, port, job)}
    report["huge_line_closed"] = huge_line(host, port)
    if "--flood" in argv:
        report["half_open"] = half_open(host, port, 2000)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
