"""Runs on the user's (or a developer's) machine: renders docs/reference.md, the one page that lists
every flag and every GAUDI_CLUSTER_* variable, from the settings' own declarations.

The master's settings come from ClusterConfig (settings.config.SETTINGS), so their flag, variable,
default and meaning cannot drift from the code. The variables read elsewhere (the node scripts, the
entrypoint, the workload, what the agent sets for a rank) are declared here once; the docs test checks
that every GAUDI_CLUSTER_* name in the code is one of the two, and that the page is current.

    python -m gaudi_cluster.settings.reference            # print the page
    python -m gaudi_cluster.settings.reference --write    # rewrite docs/reference.md
"""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.settings.config import SETTINGS, Setting
from gaudi_cluster.settings.flags import shown_default

PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference.md"


class ReadBy(enum.Enum):
    """Which part of the product reads a variable (the page's sections, in this order)."""

    NODE_SCRIPTS = (
        "the scripts that start a node's container (scripts/run-node.sh, slurm/gaudi-cluster.sbatch)"
    )
    ENTRYPOINT = "the image's entrypoint, on every node"
    WORKLOAD = "the bundled workload (app/train), in each rank"
    SET_FOR_RANKS = "set by gaudi-cluster for each rank (read them, never set them)"
    DRILLS = "fault and straggler drills (tests, benchmarks, rehearsals)"
    TOOLS = "the project's own tools (tests, make, `gaudi-cluster aws`)"


@dataclass(frozen=True)
class Variable:
    """A GAUDI_CLUSTER_* variable that is not a master setting."""

    name: str
    read_by: ReadBy
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("GAUDI_CLUSTER_IMAGE", ReadBy.NODE_SCRIPTS, "gaudi-cluster:gaudi", "the image every node runs"),
    Variable(
        "GAUDI_CLUSTER_KEYS", ReadBy.NODE_SCRIPTS, ".keys", "where `make keys` wrote the cluster's keys"
    ),
    Variable(
        "GAUDI_CLUSTER_NODE_KEYS",
        ReadBy.NODE_SCRIPTS,
        "(required)",
        "compose/node.yaml: this node's part of the keys, `.keys/master` on the master, "
        "`.keys/nodes/NAME` on a worker (never `.keys` itself: it holds the host CA)",
    ),
    Variable(
        "GAUDI_CLUSTER_OUTPUT",
        ReadBy.NODE_SCRIPTS,
        "/data/gaudi-cluster",
        "the host directory mounted as the job's output (checkpoints, the model, the job's logs)",
    ),
    Variable(
        "GAUDI_CLUSTER_RUNTIME",
        ReadBy.NODE_SCRIPTS,
        "habana",
        "the container runtime (`docker run --runtime`); empty for none (CPU hosts)",
    ),
    Variable(
        "GAUDI_CLUSTER_PRIVILEGED",
        ReadBy.NODE_SCRIPTS,
        "1",
        "0 where the host refuses `--privileged`: a capability set instead, memlock at the host's limit",
    ),
    Variable(
        "GAUDI_CLUSTER_CODE",
        ReadBy.NODE_SCRIPTS,
        "",
        "a host directory of your code, mounted read-only at /workspace/code on every node",
    ),
    Variable(
        "GAUDI_CLUSTER_DATA",
        ReadBy.NODE_SCRIPTS,
        "",
        "a host directory of your data set, mounted read-only at /workspace/data on every node",
    ),
    Variable(
        "GAUDI_CLUSTER_HF_HOME",
        ReadBy.NODE_SCRIPTS,
        "",
        "a host directory for the Hugging Face cache, mounted at /workspace/hf with HF_HOME=/workspace/hf",
    ),
    Variable(
        "GAUDI_CLUSTER_MOUNTS",
        ReadBy.NODE_SCRIPTS,
        "",
        "more host paths for every node, `SRC:DST[:ro]`, comma-separated (run-node.sh, the sbatch script)",
    ),
    Variable(
        "GAUDI_CLUSTER_JOBS",
        ReadBy.NODE_SCRIPTS,
        "the output directory's jobs/",
        "the host directory mounted at the master's /run/gaudi-cluster/jobs: rank logs outlive the container",
    ),
    Variable(
        "GAUDI_CLUSTER_SLURM_MODE",
        ReadBy.NODE_SCRIPTS,
        "docker",
        "how the sbatch script runs the image on each node: docker, pyxis or direct",
    ),
    Variable(
        "GAUDI_CLUSTER_SLURM_LAUNCH",
        ReadBy.ENTRYPOINT,
        "auto",
        "under Slurm, how the master reaches the nodes: auto, srun (steps, no sshd) or ssh",
    ),
    Variable(
        "GAUDI_CLUSTER_MASTER_ENV_DIR",
        ReadBy.ENTRYPOINT,
        "",
        "the master only: each file NAME in it becomes the variable NAME of the master's environment "
        "(the Indexed Job's HF token, kept off the workers' containers)",
    ),
    Variable(
        "GAUDI_CLUSTER_ROLE",
        ReadBy.ENTRYPOINT,
        "worker",
        "the node's role when none is given: master, worker, auto",
    ),
    Variable(
        "GAUDI_CLUSTER_AUTO_ROLE",
        ReadBy.ENTRYPOINT,
        "",
        "set by role auto for the entrypoint it goes back to (never set it): the role decided, "
        "`ROLE ENGINE MASTER_HOST|- srun|ssh`",
    ),
    Variable(
        "GAUDI_CLUSTER_SYSFS_ROOT",
        ReadBy.ENTRYPOINT,
        "/sys",
        "where devices are read from (tests point it at a fake tree)",
    ),
    Variable(
        "GAUDI_CLUSTER_OUTPUT_DIR",
        ReadBy.ENTRYPOINT,
        "/workspace/output",
        "the default job's --output_dir on every node (read by the master, which passes it on)",
    ),
    Variable(
        "GAUDI_CLUSTER_FLAVOR", ReadBy.ENTRYPOINT, "set by the image", "the image's flavor: cpu or gaudi"
    ),
    Variable(
        "GAUDI_CLUSTER_DATA_DIR",
        ReadBy.WORKLOAD,
        "/opt/gaudi-cluster/data",
        "where the embedded default data set is read or made",
    ),
    Variable(
        "GAUDI_CLUSTER_SHARED_OUTPUT",
        ReadBy.WORKLOAD,
        "0",
        "1: the nodes share --output_dir (as `--shared_output`); checkpoints are written once",
    ),
    Variable(
        "GAUDI_CLUSTER_GAUDI_STACK_ON_CPU",
        ReadBy.WORKLOAD,
        "0",
        "1: optimum-habana's trainer on CPU (tests of the HPU branch without a card)",
    ),
    Variable(
        "GAUDI_CLUSTER_ECHO_EVENTS",
        ReadBy.WORKLOAD,
        "0",
        "1: print the workload's events as `gaudi-cluster-event {...}` lines (outside gaudi-cluster)",
    ),
    Variable("GAUDI_CLUSTER_JOB_ID", ReadBy.SET_FOR_RANKS, "", "the job's id"),
    Variable("GAUDI_CLUSTER_ATTEMPT", ReadBy.SET_FOR_RANKS, "", "the attempt's number, 1 for the first"),
    Variable("GAUDI_CLUSTER_EVENTS_FILE", ReadBy.SET_FOR_RANKS, "", "where the rank writes its events"),
    Variable(
        "GAUDI_CLUSTER_PROGRESS_FILE", ReadBy.SET_FOR_RANKS, "", "the file the rank rewrites after each step"
    ),
    Variable(
        "GAUDI_CLUSTER_FAULTS",
        ReadBy.DRILLS,
        "",
        "faults to inject: POINT@STEP[:rank=R][:attempt=A], comma-separated (app/train/faults.py)",
    ),
    Variable("GAUDI_CLUSTER_FAULT_RANK", ReadBy.DRILLS, "0", "the rank a fault fires on by default"),
    Variable(
        "GAUDI_CLUSTER_FAULT_AT_STEP",
        ReadBy.DRILLS,
        "",
        "the older form: the fault rank exits 3 at this step",
    ),
    Variable(
        "GAUDI_CLUSTER_FAULT_PAUSE_DIR",
        ReadBy.DRILLS,
        "",
        "on a restart, rank 0 writes DIR/paused-A and waits for the test's go-ahead",
    ),
    Variable("GAUDI_CLUSTER_SLOW_RANK", ReadBy.DRILLS, "", "this rank is slowed in every step (a straggler)"),
    Variable("GAUDI_CLUSTER_SLOW_MS", ReadBy.DRILLS, "300", "milliseconds the slow rank adds to a step"),
    Variable(
        "GAUDI_CLUSTER_FUZZ_LINES",
        ReadBy.TOOLS,
        "10000",
        "lines each control-plane reader gets in tests/local/test_reader_fuzz.py (more: a longer run)",
    ),
    Variable("GAUDI_CLUSTER_FUZZ_SEED", ReadBy.TOOLS, "36", "the seed of those lines (another: other lines)"),
    Variable(
        "GAUDI_CLUSTER_AWS_SSH",
        ReadBy.TOOLS,
        "ssh",
        "the ssh client `gaudi-cluster aws ssh` runs (tests: a stub)",
    ),
)

# Names of the GAUDI_CLUSTER_ form in the code that are not variables: a heredoc's end marker, and the
# private file's entries that carry a program's hidden token-like arguments (wire.private_args), which
# the agent takes out before the program starts, so no process's environment has them.
NOT_VARIABLES = frozenset({"GAUDI_CLUSTER_EOF", "GAUDI_CLUSTER_PRIVATE_ARG", "GAUDI_CLUSTER_PRIVATE_ARG_N"})


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _setting_row(s: Setting) -> str:
    choices = getattr(s.parse, "choices", None)
    meaning = s.help + (f"; one of {', '.join(choices)}" if choices else "")
    flag = s.flag if s.switch else f"{s.flag} {s.name.upper()}"
    return f"| `{flag}` | `{s.env}` | {_cell(shown_default(s.default))} | {_cell(meaning)} |"


def all_names() -> frozenset[str]:
    """Every variable this page documents."""
    return frozenset({s.env for s in SETTINGS} | {v.name for v in VARIABLES})


def render() -> str:
    lines = [
        "# Reference: every flag and variable",
        "",
        "<!-- Generated by `python -m gaudi_cluster.settings.reference --write` from the settings' "
        "declarations; tests/unit/test_docs.py fails when it is stale. Do not edit by hand. -->",
        "",
        "## `gaudi-cluster master` (and `doctor`, which takes the survey's subset)",
        "",
        "Each setting is a flag, or the variable beside it; a flag wins over the variable, the variable "
        "over the default. An empty variable counts as unset. Durations are seconds; sizes take K, M, G.",
        "",
        "| flag | variable | default | meaning |",
        "|---|---|---|---|",
        *(_setting_row(s) for s in SETTINGS),
    ]
    for read_by in ReadBy:
        lines += ["", f"## Read by {read_by.value}", "", "| variable | default | meaning |", "|---|---|---|"]
        lines += [
            f"| `{v.name}` | {_cell(v.default or '-')} | {_cell(v.meaning)} |"
            for v in VARIABLES
            if v.read_by is read_by
        ]
    lines += [
        "",
        "## Exit codes (every command)",
        "",
        "| code | meaning |",
        "|---|---|",
        "| 0 | the job (or command) succeeded |",
        "| 1 | the job failed (a rank exited non-zero, a node was lost, a rank was stuck) |",
        "| 2 | bad input: nothing was launched; the one-line error names the culprit and the fix |",
        "| 3 | the cluster is not ready (a node not found, sshd not answering, a failed check) |",
        "| 128+N | stopped by signal N (130: Ctrl-C, 143: SIGTERM) |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster.settings.reference", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"rewrite {PAGE.name} instead of printing it")
    args = parser.parse_args(argv)
    if args.write:
        PAGE.write_text(render())
    else:
        print(render(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
