"""Master, node or user's machine: where every command's own log lines go. Kept apart from the live
view so that a node-side command (`probe`, `reap`, run on every node of every job) does not import the
console's figures to set up its logging."""

from __future__ import annotations

import logging
import sys


def configure_logging(verbose: bool) -> None:
    """Our log lines on stderr, INFO and up (-v: DEBUG); a library's only from WARNING up: their INFO
    lines (matplotlib's "generated new fontManager") are noise on a job's console."""
    logging.basicConfig(level=logging.WARNING, format="gaudi-cluster: %(message)s", stream=sys.stderr)
    logging.getLogger("gaudi_cluster").setLevel(logging.DEBUG if verbose else logging.INFO)
