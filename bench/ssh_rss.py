"""The memory of one real OpenSSH client as the master holds it: a control master
(`ssh.open_connections`' exact options) against an sshd container of the cpu image, plus one
session riding on it. Measured once (Docker), kept in bench/results/ssh_client.json; the swarm bench
counts every ssh process the master holds at this figure (the fake ssh's own processes are
`sleep`s and say nothing of a real client).

  flock /tmp/docker-tests.lock .venv/bin/python -m bench.ssh_rss      (writes ssh_client.json)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, log, unique

RESULTS = Path(__file__).resolve().parent / "results" / "ssh_client.json"
KEY_MOUNT = "/run/secrets/gaudi-cluster"
LABEL = "gaudi-cluster.cluster"


def memory_of(pid: int) -> dict[str, float]:
    """RSS, and the parts of it that are the process's own (Private) or its share (Pss), in MB."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            fields[name] = int(rest.split()[0]) / 1024
    return {
        "rss_mb": fields["Rss"],
        "pss_mb": fields["Pss"],
        "private_mb": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


def measure(image: str, key_dir: Path) -> dict[str, Any]:
    from gaudi_cluster.nodes import ssh

    name = unique("sshrss")
    try:
        mount = f"{(key_dir / 'worker').resolve()}:{KEY_MOUNT}:ro"
        started = _docker("run", "-d", "--name", name, "--label", f"{LABEL}={name}", "--hostname", "sshrss",
                          "-v", mount, image, "worker")  # fmt: skip
        if started.returncode != 0:
            raise RuntimeError(f"docker run: {started.stderr.strip()[-300:]}")
        address = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name)
        host = address.stdout.strip()
        deadline = time.monotonic() + 60
        while ssh.wait_for_sshd([host], 3022, time.monotonic()) and time.monotonic() < deadline:
            time.sleep(0.5)
        with tempfile.TemporaryDirectory(prefix="sshrss-") as tmp:
            control = Path(tmp) / "cm"
            control.mkdir()
            host_key = ssh.cluster_host_key(key_dir)
            config = ssh.write_ssh_config(Path(tmp), 3022, key_dir / "id_ed25519", control_dir=control,
                                          host_key=host_key)  # fmt: skip
            if ssh.open_connections([host], config, 30):
                raise RuntimeError(f"no control master to {host}")
            check = subprocess.run(["ssh", "-F", str(config), "-O", "check", "--", host],
                                   capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
            found = re.search(r"pid=(\d+)", check.stderr)
            if not found:
                raise RuntimeError(f"ssh -O check: {check.stderr.strip()}")
            # A session on the shared connection, as the launch and the reap run theirs.
            session = subprocess.Popen(ssh.ssh_argv(host, ["sleep", "5"], config), stdin=subprocess.DEVNULL)
            time.sleep(1.5)
            version = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False).stderr
            figures = {
                "control_master": memory_of(int(found[1])),
                "session": memory_of(session.pid),
                "version": version.strip(),
                "image": image,
                "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }
            session.wait(timeout=30)
            ssh.close_connections([host], config)
        return figures
    finally:
        _docker("rm", "-f", name)


def load() -> dict[str, Any] | None:
    try:
        return json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return None


def main() -> int:
    keys = Path(tempfile.mkdtemp(prefix="keys-")) / "keys"
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(keys)], check=True, capture_output=True)
    try:
        figures = measure(sys.argv[1] if len(sys.argv) > 1 else "gaudi-cluster:cpu", keys)
    finally:
        shutil.rmtree(keys.parent, ignore_errors=True)
    RESULTS.write_text(json.dumps(figures, indent=1) + "\n")
    log(f"ssh client: {json.dumps(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
