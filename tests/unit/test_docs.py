"""The docs against the code: every flag, variable, make target, subcommand and path that README.md and
docs/*.md name must exist, and docs/reference.md must be what the settings' declarations render."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from gaudi_cluster.settings import reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
CODE_DIRS = ("app", "entrypoint", "scripts", "slurm", "k8s", "compose", "image", "dev", "bench")
CODE_FILES = ("Makefile", "Dockerfile")

# Flags of other tools that the docs show beside ours, each with the tool that owns it. A flag of ours
# that is renamed or dropped is not here, so the test names it.
EXTERNAL_FLAGS = {
    "docker run": "--privileged --net --ipc --cap-add --cap-drop --security-opt --runtime --rm --name "
    "--network --hostname -e --env-file --volume --mount --device --shm-size --ulimit --init --entrypoint "
    "--gpus --add-host --user --workdir --detach --interactive --tty",
    "docker build / compose": "--build-arg --tag --file --no-cache --scale --detach --profile --project-name",
    "DeepSpeed's runner": "--hostfile --include --exclude --num_gpus --num_nodes --master_addr --master_port "
    "--launcher --launcher_args --no_local_rank --ssh_port --bind_cores_to_rank "
    "--bind_core_list --force_multi "
    "--no_ssh_check --module --no_python --autotuning --elastic_training --deepspeed --deepspeed_config",
    "torchrun": "--nnodes --nproc_per_node --nproc-per-node --rdzv_backend --rdzv_endpoint --rdzv-endpoint "
    "--node_rank --standalone --local-rank --local_rank --max_restarts",
    "gaudi_spawn.py": "--world_size --use_mpi --use_deepspeed --main_process_ip --main_process_port",
    "mpirun": "--rank-by --map-by --bind-to --mca --prtemca --report-bindings "
    "--allow-run-as-root --hostfile -H -x -np",
    "srun / sbatch / salloc": "--gres --export --ntasks-per-node --nodelist --overlap --kill-on-bad-exit "
    "--exclusive --no-requeue --container-mounts --container-image --wrap --input --nodes --ntasks "
    "--jobid --whole --label --time --partition --output --cpus-per-task --mpi --chdir",
    "the workload (transformers TrainingArguments, run_clm.py)": "--output_dir --model_name_or_path "
    "--overwrite_output_dir --resume_from_checkpoint --save_total_limit --gradient_accumulation_steps "
    "--gaudi_config_name --use_habana --use_lazy_mode --throughput_warmup_steps --adjust_throughput "
    "--shared_output --trainer --do_train --do_eval --per_device_train_batch_size --max_steps "
    "--num_train_epochs --learning_rate --save_steps --logging_steps --dataset_name --train_file "
    "--validation_file --block_size --bf16 --seed --report_to --config_name --tokenizer_name "
    "--use_env --max_train_samples --dataset_config_name --save_strategy --hub_token",
    "kubectl / helm / kustomize": "--cascade --tail --from-file --from-literal --namespace --kustomize -k -f",
    "pip / python / ssh-keygen / ssh": "--no-index --find-links --upgrade --requirement -m -i -p -o",
    "pytest": "--durations -k -x -q -n",
    "squeue / scancel": "--me",
    "kube-rbac-proxy (the metrics TLS/auth sidecar)": "--secure-listen-address --upstream",
    "setpriv": "--pdeathsig",
    "libfabric's and OpenMPI's configure": "--enable-verbs --enable-psm3-verbs --minimal --with-synapseai",
    "python -m bench (make bench)": "--only",
    "python -m gaudi_cluster.settings.reference": "--write",
    "scripts/k8s-host-keys.sh": "--indexed-job",
    "python -m gaudi_cluster.rank.agent (its own command line, the launchers start it)": "--control "
    "--local-rank-arg --output-dir --zygote-fd",
    "named as what is refused (no flag is abbreviated)": "--master",
    "the AWS CLI": "--latest --region --profile --query --output",
    "systemctl / journalctl": "--now --unit --follow",
}


@cache
def external_flags() -> frozenset[str]:
    return frozenset(flag for flags in EXTERNAL_FLAGS.values() for flag in flags.split())


@cache
def our_help() -> str:
    """Every subcommand's --help, as a user reads it."""

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gaudi_cluster", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"gaudi-cluster {' '.join(args)} --help failed: {done.stderr[-400:]}"
        return done.stdout

    def tree(*args: str) -> str:
        text = run(*args)
        return text + "".join(tree(*args, command) for command in subcommands(text))

    return tree()


def subcommands(top_help: str) -> list[str]:
    if "COMMAND" not in top_help:
        return []
    block = top_help.split("COMMAND", 2)[-1].split("\noptions:", 1)[0]
    return re.findall(r"^    ([a-z][a-z0-9-]*)\s", block, flags=re.MULTILINE)


@cache
def doc_text() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for path in DOCS}


def code_text() -> str:
    files = [ROOT / name for name in CODE_FILES]
    for directory in CODE_DIRS:
        files += [p for p in (ROOT / directory).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return "\n".join(p.read_text(errors="replace") for p in files)


def test_the_reference_page_is_what_the_declarations_render():
    assert reference.PAGE.read_text() == reference.render(), (
        "docs/reference.md is stale; fix: python -m gaudi_cluster.settings.reference --write"
    )


def test_every_variable_in_the_code_is_in_the_reference():
    named = set(re.findall(r"GAUDI_CLUSTER_[A-Z0-9_]*[A-Z0-9]", code_text())) - reference.NOT_VARIABLES
    missing = sorted(named - reference.all_names())
    assert not missing, (
        f"variables read by the code but not in the reference: {missing}; fix: declare them in "
    )
    "app/gaudi_cluster/settings/reference.py (VARIABLES), then --write"


def test_every_variable_the_reference_declares_is_in_the_code():
    code = code_text()
    dead = [v.name for v in reference.VARIABLES if v.name not in code]
    assert not dead, f"the reference documents variables no code reads: {dead}"


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_variable_a_doc_names_exists(doc):
    named = set(re.findall(r"GAUDI_CLUSTER_[A-Z0-9_]*[A-Z0-9]", doc_text()[doc]))
    unknown = sorted(named - reference.all_names() - reference.NOT_VARIABLES)
    assert not unknown, f"{doc} names variables the product does not have: {unknown}"


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_flag_a_doc_names_is_ours_or_another_tools(doc):
    ours = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", our_help()))
    flags = set(re.findall(r"(?:^|[\s`(\[|])(--[a-z][a-z0-9_-]*)", doc_text()[doc], flags=re.MULTILINE))
    unknown = sorted(flags - ours - external_flags())
    assert not unknown, (
        f"{doc} names flags no gaudi-cluster command accepts: {unknown}; fix: correct the doc, or, for "
        "another tool's flag, add it to EXTERNAL_FLAGS in tests/unit/test_docs.py with the tool"
    )


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_make_target_a_doc_names_exists(doc):
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", makefile, flags=re.MULTILINE))
    named = set(re.findall(r"`make ([a-z][\w-]*)", doc_text()[doc]))
    assert not named - targets, f"{doc} names make targets the Makefile lacks: {sorted(named - targets)}"


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_subcommand_a_doc_names_exists(doc):
    commands = set(subcommands(our_help()))
    named = set(re.findall(r"`gaudi-cluster ([a-z][\w-]*)", doc_text()[doc]))
    assert not named - commands, f"{doc} names subcommands that do not exist: {sorted(named - commands)}"


REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:app|bench|compose|dev|docs|entrypoint|image|k8s|requirements|scripts|slurm|tests)"
    r"/[\w./*-]*[\w*])"
)


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_repository_path_a_doc_names_exists(doc):
    text = doc_text()[doc]
    missing = sorted({p for p in REPO_PATH.findall(text) if not any(ROOT.glob(p))})
    assert not missing, f"{doc} names paths the repository lacks: {missing}"


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_image_path_of_the_app_exists(doc):
    """/opt/gaudi-cluster/app/X is the repository's app/X (the Dockerfile copies app/ there)."""
    assert "COPY app/ /opt/gaudi-cluster/app/" in (ROOT / "Dockerfile").read_text()
    named = set(re.findall(r"/opt/gaudi-cluster/app/([\w./-]*\w)", doc_text()[doc]))
    missing = sorted(p for p in named if not (ROOT / "app" / p).exists())
    assert not missing, f"{doc} names image paths that the image does not have: {missing}"
