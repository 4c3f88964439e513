"""TCP ports for tests whose server runs in a child process.

A server started in the test's own process binds port 0 and the test reads the port it got (ControlServer's
`.port`): nothing to race. A child process (a master, a rank, DeepSpeed's rendezvous) that must bind a port
named on its command line gets one held by `held_port()`: the port stays bound (SO_REUSEADDR, never
listening) until the block ends, so the kernel hands it to no other bind(0) or outgoing connection on the
machine, and no other suite's plain bind can take it, while the child, whose listeners set SO_REUSEADDR
(Python's socket.create_server, torch's TCPStore), binds it and listens. The old "find a free port, close
it, bind it later" raced every other process on the machine in between (EADDRINUSE, issue 37).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback/any-address port no one else on the machine gets until the block ends."""
    hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hold.bind(("0.0.0.0", 0))
        yield hold.getsockname()[1]
    finally:
        hold.close()
