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
import threading
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


def nested(host: str, port: int, count: int) -> int:
    """Lines that nest past the JSON parser's recursion limit (it used to kill the connection's thread
    and leak its slot); returns how many connections the master closed."""
    closed = 0
    for _ in range(count):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(b"[" * 2000 + b"\n")
            closed += _closed_within(sock, 10)
    return closed


def _trickle(host: str, port: int, until: float, held_for: list[float]) -> None:
    """Slowloris: one byte every 0.5 s, never a whole line; records how long the master kept each."""
    while time.monotonic() < until:
        try:
            sock = socket.create_connection((host, port), timeout=5)
        except OSError:
            time.sleep(0.2)
            continue
        opened = time.monotonic()
        try:
            while time.monotonic() < until:
                sock.sendall(b"[")
                time.sleep(0.5)
        except OSError:
            pass
        finally:
            held_for.append(time.monotonic() - opened)
            sock.close()


def jam(host: str, port: int, seconds: float, connections: int = 40) -> dict[str, object]:
    """Keep `connections` slowloris peers on the port and nested lines coming for `seconds`, from the
    moment it first answers: what a flood does to ranks that check in meanwhile."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)
    until = time.monotonic() + seconds
    held_for: list[float] = []
    threads = [
        threading.Thread(target=_trickle, args=(host, port, until, held_for)) for _ in range(connections)
    ]
    for thread in threads:
        thread.start()
    sent = closed = 0
    while time.monotonic() < until:
        try:
            closed += nested(host, port, 1)
        except OSError:
            break  # the job ended and its port with it
        sent += 1
    for thread in threads:
        thread.join()
    ended = [held for held in held_for if held < seconds - 1]  # cut by the master, not by our stop
    return {"nested_sent": sent, "nested_closed": closed, "slowloris": len(held_for),
            "longest_held_s": round(max(ended, default=0.0), 2)}  # fmt: skip


def main(argv: list[str]) -> int:
    host, port, job = argv[0], int(argv[1]), argv[2]
    if "--jam" in argv:
        print(json.dumps(jam(host, port, float(argv[argv.index("--jam") + 1]))))
        return 0
    report = {"forged_exit_closed": forged_exit(host, port, job), "garbage_dropped": garbage(host, port, job)}
    report["huge_line_closed"] = huge_line(host, port)
    if "--flood" in argv:
        report["half_open"] = half_open(host, port, 2000)
        report["nested_closed"] = nested(host, port, 50)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
