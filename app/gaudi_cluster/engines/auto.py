"""The engine that placed this container (Slurm, Kubernetes) and what it implies for the node. Pure.

- `auto_role`: the role `auto` resolves to. The Kubeflow MPI Operator names it (K_MPI_JOB_ROLE:
  launcher -> master), an Indexed Job numbers its pods (JOB_COMPLETION_INDEX 0 -> master), and a
  Slurm step numbers its nodes (SLURM_NODEID 0, or the first host of the step's node list -> master).
- `engine_defaults`: settings an engine decides when the user did not (the rendezvous port of a Slurm
  job, derived from its id).
- `MasterWatch`: when a Slurm worker is done. Slurm ends a step only once every task has exited, and
  a worker's sshd never exits on its own, so each worker follows its master: it exits 0 as soon as
  the master releases it (the master does so over ssh at its very end, whatever the outcome), and
  exits 1 once the master has been unreachable for `gone_after_s` (its node died) or never appeared
  within `startup_timeout_s`. While ranks of a job run on the node, their agents watch the master's
  heartbeat, so the worker only knocks on the master's sshd port when none runs: a knock is a log
  line on the master's side. When Slurm itself ends the step (scancel, --kill-on-bad-exit, the time
  limit) the worker gets SIGTERM, and so do its sshd and, where Slurm tracks them, the ranks under
  it; the worker then exits 0 as soon as no rank agent runs on the node any more (the ranks have
  saved their checkpoint and exited): waiting longer would only wait for a release that a node
  without sshd cannot receive, and exiting earlier would let Slurm kill ranks still saving.
  Where the master reaches the nodes through srun (nodes/srun) the worker runs no sshd and never
  knocks (`knocks=False`): it waits for the release (an srun step of the master's) or the SIGTERM
  of the step's end. A master gone is Slurm's to notice then: its node's death or its non-zero exit
  ends the step (--kill-on-bad-exit), and a master that exits 0 has released every worker first.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import slurm
from gaudi_cluster.settings.config import ClusterConfig

MASTER = "master"
WORKER = "worker"
SLURM = "slurm"
INDEXED_JOB = "indexed-job"
MPI_OPERATOR = "mpi-operator"
RELEASE_PREFIX = "released-"


@dataclass(frozen=True)
class AutoRole:
    role: str  # MASTER | WORKER
    engine: str  # SLURM | INDEXED_JOB | MPI_OPERATOR
    reason: str  # the variable that decided, for the log
    master_host: str | None = None  # a Slurm worker's master (the host it follows)


def _index(name: str, value: str) -> int:
    if re.fullmatch(r"[0-9]+", value.strip()) is None:
        raise ConfigError(f"{name}='{value}' is not an index; fix: leave it as the engine sets it")
    return int(value)


def _same_host(slurm_name: str, hostnames: Collection[str]) -> bool:
    # Slurm node names are usually short names; the container may know itself by its FQDN.
    return any(slurm_name in (name, name.split(".", 1)[0]) for name in hostnames if name)


def auto_role(env: Mapping[str, str], hostnames: Collection[str]) -> AutoRole:
    """The role `auto` means here; ConfigError when no engine says (then pass master or worker)."""
    mpi_role = env.get("K_MPI_JOB_ROLE", "").strip()
    if mpi_role:
        if mpi_role not in ("launcher", "worker"):
            raise ConfigError(
                f"K_MPI_JOB_ROLE='{mpi_role}' is neither launcher nor worker; "
                "fix: run under the MPI Operator, or pass the role master or worker"
            )
        role = MASTER if mpi_role == "launcher" else WORKER
        return AutoRole(role, MPI_OPERATOR, f"K_MPI_JOB_ROLE={mpi_role}")
    completion_index = env.get("JOB_COMPLETION_INDEX", "").strip()
    if completion_index:
        index = _index("JOB_COMPLETION_INDEX", completion_index)
        return AutoRole(MASTER if index == 0 else WORKER, INDEXED_JOB, f"JOB_COMPLETION_INDEX={index}")
    if slurm.in_slurm_step(env):
        master_host = slurm.first_host(env)
        node = slurm.node_id(env)
        if node is not None:
            role, reason = (MASTER if node == 0 else WORKER), f"SLURM_NODEID={node}"
        else:
            role = MASTER if _same_host(master_host, hostnames) else WORKER
            reason = f"first host of {slurm.nodelist_variable(env)} is {master_host}"
        return AutoRole(role, SLURM, reason, None if role == MASTER else master_host)
    raise ConfigError(
        "role auto needs an engine to decide (K_MPI_JOB_ROLE, JOB_COMPLETION_INDEX or a Slurm step); "
        "fix: pass the role master or worker"
    )


def engine_defaults(config: ClusterConfig, env: Mapping[str, str]) -> ClusterConfig:
    """The Slurm job's rendezvous port unless the port was chosen (GAUDI_CLUSTER_MASTER_PORT)."""
    port = slurm.master_port(env)
    default_port = next(f.default for f in dataclasses.fields(ClusterConfig) if f.name == "master_port")
    if port is None or env.get("GAUDI_CLUSTER_MASTER_PORT") or config.master_port != default_port:
        return config
    return dataclasses.replace(config, master_port=port)


def release_marker_name(key: str) -> str:
    """The file the master leaves on a worker to release it (key: slurm.run_key of the step)."""
    if re.fullmatch(r"[0-9]+\.[0-9]+", key) is None:
        raise ConfigError(f"release key '{key}' is not <job>.<step>; fix: pass slurm.run_key() unchanged")
    return RELEASE_PREFIX + key


@dataclass(frozen=True)
class WatchVerdict:
    exit_code: int
    message: str


class MasterWatch:
    """Decides, from what a worker observes each tick, whether and how it exits (see module doc)."""

    def __init__(
        self,
        master: str,
        started_at: float,
        startup_timeout_s: float,
        gone_after_s: float,
        knocks: bool = True,
    ) -> None:
        self.master = master
        self.knocks = knocks
        self.started_at = started_at
        self.startup_timeout_s = startup_timeout_s
        self.gone_after_s = gone_after_s
        self.last_alive: float | None = None

    def should_knock(self, agents_running: bool) -> bool:
        """Knock on the master's sshd only when no rank agent vouches for the master (never under srun)."""
        return self.knocks and not agents_running

    def observe(
        self,
        now: float,
        *,
        released: bool,
        agents_running: bool,
        master_answers: bool | None,
        stop_requested: bool = False,
    ) -> WatchVerdict | None:
        """None: keep going. master_answers None: not knocked this tick."""
        if released:
            return WatchVerdict(0, f"released by the master on {self.master}; the job is over")
        if stop_requested and not agents_running:
            return WatchVerdict(0, "Slurm ended the step and no rank runs on this node any more")
        if not self.knocks:
            return None  # Slurm ends the step when the master is gone
        if agents_running or master_answers:
            self.last_alive = now
            return None
        if self.last_alive is None:
            if now - self.started_at > self.startup_timeout_s:
                return WatchVerdict(
                    1,
                    f"the master on {self.master} never answered within {self.startup_timeout_s:.0f}s; "
                    "fix: see the master's log (slurm job output, node 0)",
                )
            return None
        if now - self.last_alive > self.gone_after_s:
            return WatchVerdict(
                1,
                f"the master on {self.master} has been unreachable for {now - self.last_alive:.0f}s "
                "without releasing this node; the job is over",
            )
        return None
