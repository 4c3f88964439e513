"""Under Slurm, Slurm starts our processes: the srun steps the master plans inside its allocation. Pure.

Inside an allocation with `srun` on PATH (the sbatch's `direct` mode, bare-metal sites) the master
reaches the other nodes with one `srun --overlap` step per phase, never with ssh: the probe (which
also stages each node's private payload), the launch of the direct launcher's per-node process, the
removal of the private files, the reap and the release of the workers. Slurm's tree fans each step
out, its cgroups and accounting hold what the step starts, and scancel signals it. The workers' tasks
then run no sshd and never knock on the master. Decided by `launch_mode` from the same inputs on the
master and on every worker (`nodewatch role`); GAUDI_CLUSTER_SLURM_LAUNCH=ssh keeps ssh.

Trust: a step's stdin (`--input=all`) reaches every task of it, so each node receives every node's
private payload and keeps only its own (picked by SLURMD_NODENAME, the name slurmd gives the task);
the others are never written nor logged. Slurm's own channel carries it (munge-authenticated
srun <-> slurmstepd, the same one that already carries the job's whole environment to every node
with --export=ALL, secrets the user exported included). What is given up against ssh: a node could
read another node's key from its stdin while it runs, so a compromised node could act as another
in the control channel for this attempt. ssh's mode gives each node only its own key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import slurm

LAUNCH_VARIABLE = "GAUDI_CLUSTER_SLURM_LAUNCH"
SRUN = "srun"
SSH = "ssh"
LAUNCH_CHOICES = ("auto", SRUN, SSH)
NODE_NAME_VARIABLE = "SLURMD_NODENAME"  # the Slurm node name of a task, set by slurmd
NODE_LINE_PREFIX = "gaudi-cluster-node "  # the first line a probe task prints under srun
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
# srun's own line for a task that failed: "srun: error: node3: task 2: Exited with exit code 1".
_TASK_ERROR = re.compile(r"^srun: error: (\S+): tasks? [0-9,-]+: (.*)$")


def launch_mode(env: Mapping[str, str], srun_path: str | None) -> str:
    """SRUN inside a Slurm allocation with srun on PATH (unless the setting says ssh), else SSH."""
    choice = env.get(LAUNCH_VARIABLE, "").strip() or "auto"
    if choice not in LAUNCH_CHOICES:
        raise ConfigError(f"{LAUNCH_VARIABLE}='{choice}' is not a choice; fix: {', '.join(LAUNCH_CHOICES)}")
    inside = slurm.in_slurm_step(env) and slurm.job_id(env) is not None
    if choice == SSH:
        return SSH
    if choice == SRUN and not (inside and srun_path):
        where = "no srun on PATH" if inside else "not inside a Slurm allocation"
        raise ConfigError(
            f"{LAUNCH_VARIABLE}=srun but {where}; fix: run under sbatch's direct mode with Slurm's client "
            f"installed, or unset {LAUNCH_VARIABLE}"
        )
    return SRUN if inside and srun_path else SSH


@dataclass(frozen=True)
class SrunStep:
    """How the master starts a step of its own job: which srun, inside which job."""

    srun: str  # the srun executable (an absolute path from PATH)
    job_id: int

    def argv(
        self,
        hosts: Sequence[str],
        name: str,
        *,
        stdin: bool = False,
        label: bool = False,
    ) -> list[str]:
        """One task on each of `hosts`, overlapping the job's main step (which holds every CPU).

        --whole and --cpu-bind=none: a task gets its node's whole share of the job, not one CPU, as
        the ranks under it need. --kill-on-bad-exit=0: one node's failure is the master's to judge
        (a probe of the others still reports; the supervisor names the failed rank).
        """
        if not hosts:
            raise ValueError("an srun step needs at least one host")
        count = len(hosts)
        return [
            self.srun,
            "--overlap",
            "--whole",
            f"--jobid={self.job_id}",
            f"--job-name={name}",
            f"--nodes={count}",
            f"--ntasks={count}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(hosts)}",
            "--cpu-bind=none",
            "--kill-on-bad-exit=0",
            "--export=ALL",
            f"--input={'all' if stdin else 'none'}",
            *(["--label"] if label else []),
        ]

    def to_json(self) -> str:
        return json.dumps({"srun": self.srun, "job_id": self.job_id})

    @classmethod
    def from_json(cls, text: str) -> SrunStep:
        data = json.loads(text)
        srun, job = data.get("srun"), data.get("job_id")
        if not isinstance(srun, str) or not srun or not isinstance(job, int) or isinstance(job, bool):
            raise ValueError(f"srun step: expected srun (text) and job_id (integer), got {text!r:.120}")
        return cls(srun, job)


def step_for(env: Mapping[str, str], srun_path: str | None) -> SrunStep | None:
    """The master's srun steps when `launch_mode` says srun, else None (ssh)."""
    if launch_mode(env, srun_path) != SRUN:
        return None
    job = slurm.job_id(env)
    assert job is not None and srun_path is not None  # launch_mode checked both
    return SrunStep(srun_path, job)


def split_labelled(text: str) -> dict[int, list[str]]:
    """`srun --label` output, by task id; lines without a label (srun's own) are left out."""
    tasks: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = _LABEL.match(line)
        if match:
            tasks.setdefault(int(match.group(1)), []).append(match.group(2))
    return tasks


def outputs_by_node(text: str) -> dict[str, list[str]]:
    """Each task's lines after its first NODE_LINE_PREFIX line, by the node name that line gives.

    The task says where it ran: Slurm numbers a step's tasks in its own node order, which need not be
    the order the master listed the hosts in."""
    found: dict[str, list[str]] = {}
    for lines in split_labelled(text).values():
        for index, line in enumerate(lines):
            if line.startswith(NODE_LINE_PREFIX):
                found[line[len(NODE_LINE_PREFIX) :].strip()] = lines[index + 1 :]
                break
    return found


def task_errors(stderr: str) -> dict[str, str]:
    """srun's own verdict on each failed task, by node name ("Exited with exit code 1")."""
    errors: dict[str, str] = {}
    for line in stderr.splitlines():
        match = _TASK_ERROR.match(line.strip())
        if match:
            errors.setdefault(match.group(1), match.group(2))
    return errors


def pick_own(entries: Mapping[str, object], env: Mapping[str, str]) -> str:
    """The key of `entries` that names this node (SLURMD_NODENAME, else its short form); ConfigError."""
    name = env.get(NODE_NAME_VARIABLE, "").strip()
    if not name:
        raise ConfigError(f"no {NODE_NAME_VARIABLE} here; fix: let the master start this task with srun")
    for key in (name, name.split(".", 1)[0]):
        if key in entries:
            return key
    raise ConfigError(
        f"this node ({NODE_NAME_VARIABLE}={name}) is not among the {len(entries)} nodes of the master's "
        "step; fix: let the master start this task with srun"
    )
