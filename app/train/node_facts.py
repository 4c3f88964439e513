"""What an HPU (or EFA) node adds to the fabric check, read on the node by its first rank: the Gaudi
NIC ports' link state (`hl-smi -n link`), the L3 scale-out file (`gaudinet.json`, where the check is
told it belongs), the EFA device count, and on a failed test the last lines of the HCCL logs. Each part
is best effort: a fact that cannot be read is left out, never fatal.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

PORT_LINE = re.compile(r"port\s*(\d+)\s*:?\s*(up|down)\b", re.IGNORECASE)
TAIL_LINES = 20


def port_states(text: str) -> dict[str, str]:
    """`hl-smi -n link` text -> {"<card>/<port>": "up"|"down"}; cards are counted by restarts at port 0."""
    states: dict[str, str] = {}
    card = -1
    for match in PORT_LINE.finditer(text):
        port, state = int(match.group(1)), match.group(2).lower()
        if port == 0 or card < 0:
            card += 1
        states[f"{card}/{port}"] = state
    return states


def facts(gaudinet: str = "") -> dict[str, Any]:
    """The node's facts; its Gaudi NIC ports wherever hl-smi is (an HPU node, whatever the check's backend:
    a port down stops HCCL, not the check's own traffic)."""
    found: dict[str, Any] = {"efa_devices": len(glob.glob("/dev/infiniband/uverbs*"))}
    if shutil.which("hl-smi"):
        try:
            done = subprocess.run(
                ["hl-smi", "-n", "link"], capture_output=True, text=True, timeout=20, check=False
            )
            if done.returncode == 0:
                found["ports"] = port_states(done.stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if gaudinet:  # only L3 scale-out uses one: asked for by path ($GAUDINET_PATH), never guessed
        found["gaudinet"] = {"path": gaudinet, "present": os.path.isfile(gaudinet)}
    return found


def hccl_log_tail(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The last lines of the newest HCCL log under HABANA_LOGS (what a failing rank left behind)."""
    root = environ.get("HABANA_LOGS", "/var/log/habana_logs/")
    logs = sorted(glob.glob(os.path.join(root, "**", "*hccl*.log"), recursive=True), key=os.path.getmtime)
    if not logs:
        return []
    try:
        with open(logs[-1], errors="replace") as handle:
            return [f"{logs[-1]}: {line.rstrip()}" for line in handle.readlines()[-TAIL_LINES:]]
    except OSError:
        return []
