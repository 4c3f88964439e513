"""The master's ssh fan-out at 64, 256 and 1,000 nodes, over a fake ssh (bench/fake_ssh/ssh).

The fake is put first on PATH of the master's side only; each "node" is a light stub, so the master's
own code runs unchanged: `ssh.open_connections` (a control master per node), `survey.probe_nodes`
(each stub prints a valid NodeReport for its host, the staged private payload goes in on stdin),
then the teardown of master.py (`cleanup.reap_everywhere`, `NodeSurvey.release`: `ssh -O exit`).
The anchors run the same probe stub over the same fake: `pdsh -R ssh -f 64` and `-f 1024`.

  probe_s     open_connections start -> every node's report read (the survey's ssh part)
  teardown_s  reap start -> every stub's reap done, every control master gone, no ssh child left
  held_at_launch  control masters alive once the probe is done (the launch sessions ride them)
  launch_s    the direct launcher's fan-out (launch.fanout, a handing-over spec per node; each fake
              session holds FAKE_SSH_SEAT_S, 0.3 s, as a node seating its ranks) -> every session ended
  sessions_peak   launch sessions open at once during it (the fan-out's waves bound them)
  held        control masters alive once the ranks are in and Reach.release stopped them (what the
              master holds through the job: none, the direct launcher's sessions ended by then)

  python -m bench.swarm_fanout master --nodes N --dir D   (the master's side of one run)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, WORK, Ctx, Row, Target, failed_row, log, stat

FAKE_SSH = Path(__file__).resolve().parent / "fake_ssh"
JOB = "20261202-000000-fanout"
WAIT_S = 60.0  # a teardown that has not ended by then is said as capped
PROBE_ARGV = [sys.executable, "-m", "gaudi_cluster.nodes.probe", "--json", "--accelerator", "cpu"]


def host_names(nodes: int) -> list[str]:
    return [f"node{i:04d}" for i in range(nodes)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; its parent (init) reaps it when it gets to it


def held_masters(state: Path) -> list[int]:
    """The fake control masters still alive (pids from hold/)."""
    pids = []
    for path in (state / "hold").iterdir():
        try:
            pid = int(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(pid):
            pids.append(pid)
    return pids


def prepare(state: Path, hosts: list[str]) -> None:
    """The stubs' node reports (one per host, its own name and address) and their state folders."""
    from gaudi_cluster.wire.node_report import Interface, NodeReport

    for sub in ("reports", "hold", "reaped", "launch", "ended"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    for i, host in enumerate(hosts):
        address = f"10.{i // 250 % 250}.{i % 250}.2"
        report = NodeReport(accelerator="cpu", slots=8, hostname=host, cpus=64,
                            interfaces=(Interface("eth0", (address,)),))  # fmt: skip
        (state / "reports" / f"{host}.json").write_text(report.to_json() + "\n")


# --- the master's side (a process of its own: PATH starts with the fake) --------------------------


def master(nodes: int, state: Path) -> dict[str, Any]:
    import psutil
    from gaudi_cluster.nodes import cleanup, ssh
    from gaudi_cluster.nodes.find import FindSettings
    from gaudi_cluster.nodes.reach import SshReach
    from gaudi_cluster.nodes.survey import NodeSurvey, SurveySettings, probe_command, probe_nodes
    from gaudi_cluster.wire.private_payload import PrivatePayload

    hosts = host_names(nodes)
    job_dir = state / "job"
    job_dir.mkdir()
    control_dir = Path(tempfile.mkdtemp(prefix="gc-ssh-"))
    config = ssh.write_ssh_config(job_dir, 3022, None, control_dir=control_dir)
    find = FindSettings(",".join(hosts), None, None, None, 8, None)
    settings = SurveySettings(find=find, wait_timeout=120, ssh_port=3022, ssh_dir=str(state),
                              accelerator="cpu", env_preset="cpu", socket_ifname=None, job_root=str(state),
                              dry_run=False)  # fmt: skip
    reach = SshReach(config, 3022, control_dir)
    began = time.monotonic()
    failed = ssh.open_connections(hosts, config, 60)
    reach.opened.update(hosts)
    opened = time.monotonic()
    command = probe_command(settings, [], {}, JOB, True, None)
    reports, unreachable = probe_nodes(
        reach, hosts, command, lambda host: PrivatePayload(host, "0" * 64), began + 120
    )
    probed = time.monotonic()
    at_launch = len(held_masters(state))
    launch = launch_sessions(hosts, config, state)
    reach.release()  # what the master does once every rank is in (job/attempt.all_in)
    settled = time.monotonic() + 2.0  # a stopped master ends with its last session: there is none here
    while held_masters(state) and time.monotonic() < settled:
        time.sleep(0.01)
    held = len(held_masters(state))
    survey = NodeSurvey(
        job_id=JOB, job_dir=job_dir, master_addr=hosts[0], local_addr="10.0.0.1",
        socket_ifname=None, hosts=tuple(hosts), requested_slots={}, paths=(), reports=reports,
        unreachable=unreachable, reach=reach,
    )  # fmt: skip
    teardown = time.monotonic()
    cleanup.reap_everywhere(survey, str(state))
    survey.release()
    me = psutil.Process()
    while time.monotonic() - teardown < WAIT_S:
        reaped = len(os.listdir(state / "reaped"))
        if reaped == nodes and not held_masters(state) and not me.children(recursive=True):
            break
        time.sleep(0.01)
    ended = time.monotonic()
    return {
        "open_s": opened - began,
        "probe_s": probed - began,
        "teardown_s": ended - teardown,
        "teardown_capped": ended - teardown >= WAIT_S,
        "held": held,
        "held_at_launch": at_launch,
        **launch,
        "reports": len(reports),
        "unreachable": len(unreachable) + len(failed),
        "reaped": len(os.listdir(state / "reaped")),
        "left": len(held_masters(state)),
    }


def launch_sessions(hosts: list[str], config: Path, state: Path) -> dict[str, Any]:
    """The direct launcher's real fan-out (launch.fanout) of a handing-over node spec to every host:
    how long until every node's session ended, and how many the master held at once."""
    from gaudi_cluster.launch import fanout
    from gaudi_cluster.wire.node_spec import FANOUT_MODULE, FanoutSpec, NodeEntry, NodeSpec

    spec = NodeSpec(node_rank=0, nnodes=len(hosts), first_rank=0, slots=tuple(range(8)),
                    world_size=8 * len(hosts), master_addr="10.0.0.1", master_port=29500, cwd="/w", env={},
                    python=sys.executable, agent_args=("--", "train.py"), hand_over=True)  # fmt: skip
    launch = FanoutSpec(sys.executable, str(config), tuple(NodeEntry(host, False, spec) for host in hosts))
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", FANOUT_MODULE], input=launch.to_json(), text=True,
                          capture_output=True, timeout=600, check=False)  # fmt: skip
    took = time.monotonic() - began
    counts = [int(line) for line in (state / "sessions").read_text().split()] if done.returncode == 0 else []
    return {
        "launch_s": took,
        "launch_code": done.returncode,
        "launched": len(os.listdir(state / "ended")),
        "sessions_peak": max(counts, default=0),
        "launch_wave": fanout.LAUNCH_WAVE,
    }


# --- the bench's side -----------------------------------------------------------------------------


def _env(state: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{FAKE_SSH}:{os.environ.get('PATH', '')}", "FAKE_SSH_DIR": str(state)}


def ours(nodes: int) -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="fanout-", dir=WORK))
    try:
        prepare(state, host_names(nodes))
        done = subprocess.run(
            [sys.executable, "-m", "bench.swarm_fanout", "master", "--nodes", str(nodes),
             "--dir", str(state)],
            cwd=ROOT, env=_env(state), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
        return json.loads(lines[-1])
    finally:
        for pid in held_masters(state) if (state / "hold").is_dir() else []:  # a run cut short
            os.kill(pid, 15)
        shutil.rmtree(state, ignore_errors=True)


def pdsh(nodes: int, fanout: int) -> dict[str, Any]:
    """pdsh's sliding window over the same fake ssh, running the same probe stub on every host."""
    WORK.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="pdsh-", dir=WORK))
    try:
        hosts = host_names(nodes)
        prepare(state, hosts)
        (state / "hosts").write_text("\n".join(hosts) + "\n")
        argv = ["pdsh", "-R", "ssh", "-f", str(fanout), "-w", f"^{state / 'hosts'}", shlex.join(PROBE_ARGV)]
        began = time.monotonic()
        done = subprocess.run(argv, env=_env(state), capture_output=True, text=True, timeout=300, check=False)
        wall = time.monotonic() - began
        answered = sum(1 for line in done.stdout.splitlines() if '"schema"' in line)
        if done.returncode != 0 or answered != nodes:
            return {"error": f"pdsh exit {done.returncode}, {answered}/{nodes} reports: {done.stderr[-300:]}"}
        return {"wall_s": wall, "answered": answered}
    finally:
        shutil.rmtree(state, ignore_errors=True)


SIDES = ("ours", "pdsh64", "pdsh1024")
LARGEST = 1000


def measure(ctx: Ctx, sizes: tuple[int, ...], reps: int = 3) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Every side at every size, interleaved (the order turns each repetition)."""
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {n: {side: [] for side in SIDES} for n in sizes}
    for n in sizes:
        for rep in range(reps):
            if not ctx.can_start(3 + n / 40):
                break
            for side in SIDES[rep % 3 :] + SIDES[: rep % 3]:
                found = ours(n) if side == "ours" else pdsh(n, int(side.removeprefix("pdsh")))
                runs[n][side].append(found)
                log(f"swarm fan-out: {n} nodes, {side}: {json.dumps(found)[:200]}")
    return runs


def rows(runs: dict[int, dict[str, list[dict[str, Any]]]]) -> list[Row]:
    out = []
    for n, sides in runs.items():
        suffix = "" if n == LARGEST else f".n{n}"
        good = [r for r in sides["ours"] if "error" not in r]
        if not good:
            errors = "; ".join(r["error"] for r in sides["ours"] if "error" in r)
            out.append(failed_row(f"swarm.probe_s{suffix}", f"Probe fan-out ({n} nodes)", errors or "budget"))
            continue
        probe = stat([r["probe_s"] for r in good])
        theirs = {k: stat([r["wall_s"] for r in sides[k] if "error" not in r]) for k in SIDES[1:]}
        what = f"{n} nodes, fake ssh bench/fake_ssh: a dash stub per node"
        figure = f"Probe fan-out: control masters opened, every node's report read ({what})"
        details = {"ours": good, **{k: sides[k] for k in theirs}}
        label = "pdsh -R ssh -f 1024, same stub, interleaved"
        out.append(
            Row(f"swarm.probe_s{suffix}", figure, "s", probe, theirs["pdsh1024"], label, details=details)
        )
        target = Target("ours", "<=", 5.0, "≤ 5 s") if n == LARGEST else None
        capped = sum(1 for r in good if r["teardown_capped"])
        note = f"{capped} run(s) capped at {WAIT_S:.0f} s" if capped else ""
        figure = f"Teardown: reap + ssh -O exit -> every stub reaped, no control master or ssh child ({what})"
        teardown = stat([r["teardown_s"] for r in good])
        out.append(Row(f"swarm.teardown_s{suffix}", figure, "s", teardown, target=target, note=note))
        for k in SIDES[1:]:
            width = k.removeprefix("pdsh")
            figure = (
                f"Anchor: pdsh -R ssh -f {width}, the probe stub on every node, beside our probe ({n} nodes)"
            )
            if theirs[k].values:
                out.append(Row(f"swarm.{k}_s{suffix}", figure, "s", probe, theirs[k], f"pdsh -f {width}"))
    return out


def held_per_node(runs: dict[int, dict[str, list[dict[str, Any]]]], key: str = "held") -> dict[int, float]:
    """Control masters the master holds per node through a job (key "held": once the ranks are in),
    during the launch (key "held_at_launch": each node's launch session rides one), or its launch
    sessions open at once (key "sessions_peak")."""
    held = {}
    for n, sides in runs.items():
        good = [r[key] for r in sides["ours"] if "error" not in r and key in r]
        if good:
            held[n] = max(good) / n
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.swarm_fanout")
    sub = parser.add_subparsers(dest="what", required=True)
    side = sub.add_parser("master")
    side.add_argument("--nodes", type=int, required=True)
    side.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(master(args.nodes, args.dir)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
