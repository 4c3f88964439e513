"""The docs against the code: every flag, variable, make target, subcommand and path that README.md and
docs/*.md name must exist, and docs/reference.md must be what the settings' declarations render. The
usage texts (the comments of the Dockerfile, Makefile, scripts, sbatch, compose, k8s and examples files,
the examples' docstrings, every --help) are held to the same paths; every `docker build` they tell must
find its Dockerfile and each file it copies, and every Dockerfile the docs show is one the repository has."""

from __future__ import annotations

import ast
import re
import shlex
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
    "--local-rank-arg --output-dir --zygote-fd --output-relay --ready-fd",
    "named as what is refused (no flag is abbreviated)": "--master",
    "the AWS CLI": "--latest --region --profile --query --output",
    "systemctl / journalctl": "--now --unit --follow",
    "py-spy (the profiles docs/benchmarks.md cites)": "--gil",
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
    r"(?<![\w/.-])(?:\$PWD/|\./)?"
    r"((?:app|bench|compose|dev|docs|entrypoint|examples|image|k8s|requirements|scripts|slurm|tests)"
    r"/[\w./*-]*[\w*])"
)
# The docs' commands run in the repository root: $PWD/X is the repository's X (build/ and .keys/ are
# what the documented steps make).
PWD_PATH = re.compile(r"\$PWD/((?!build/|\.keys/)[\w.-]+(?:/[\w.-]*\w)*)")
# Words that stand for a value in a path (requirements/ohabana-PROFILE.txt): any file of that shape.
PLACEHOLDER = re.compile(r"\b(?:PROFILE|NAME|MPIJOB|JOB|DIR|TAG)\b")
# Files a doc tells the user to create, never shipped: each with where it is said.
MADE_BY_THE_USER = {"compose/.env": "compose/node.yaml: the node's settings, which compose reads"}
# The example job that every doc and usage text mounts at /workspace/code and /workspace/data.
EXAMPLE_JOB = ROOT / "examples/own-job"
USAGE_FILES = (
    "Dockerfile",
    "Makefile",
    "scripts/*.sh",
    "slurm/*",
    "compose/*.yaml",
    "k8s/**/*.yaml",
    "examples/**/*",
)


def comment_lines(path: Path) -> str:
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(path.read_text())) or ""
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(line.strip()[1:] for line in lines if line.strip().startswith("#"))


HELP = "gaudi-cluster --help (every subcommand)"


def usage_files() -> dict[str, Path]:
    found = {}
    for pattern in USAGE_FILES:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                found[f"{path.relative_to(ROOT)} (comments)"] = path
    return found


# The names at collection; the --help texts are only run by the tests that read them.
TEXT_NAMES = sorted([*doc_text(), *usage_files(), HELP])


@cache
def texts() -> dict[str, str]:
    """The docs, each whole, and every usage text a user reads: file comments, docstrings, --help."""
    found = dict(doc_text())
    found.update({name: comment_lines(path) for name, path in usage_files().items()})
    found[HELP] = our_help()
    return found


def absent(path: str) -> bool:
    if path in MADE_BY_THE_USER or any(ROOT.glob(path)):
        return False
    return not any(ROOT.glob(PLACEHOLDER.sub("*", path)))


@pytest.mark.parametrize("doc", TEXT_NAMES)
def test_every_repository_path_a_doc_names_exists(doc):
    text = texts()[doc]
    named = {*REPO_PATH.findall(text), *PWD_PATH.findall(text)}
    missing = sorted(p for p in named if absent(p))
    assert not missing, f"{doc} names paths the repository lacks: {missing}"


@pytest.mark.parametrize("doc", TEXT_NAMES)
def test_every_file_a_doc_runs_in_the_mounted_code_is_the_example_jobs(doc):
    """The docs mount examples/own-job (GAUDI_CLUSTER_CODE) at /workspace/code and its data/ at
    /workspace/data: a job they show must run with those files, not with files nobody ships."""
    named = re.findall(r"/workspace/(code|data)/([\w.-]+(?:/[\w.-]+)*\w)", texts()[doc])
    where = {"code": EXAMPLE_JOB, "data": EXAMPLE_JOB / "data"}
    missing = sorted(
        {f"/workspace/{kind}/{name}" for kind, name in named if not (where[kind] / name).exists()}
    )
    assert not missing, (
        f"{doc} runs files that no example has: {missing}; fix: name files of {EXAMPLE_JOB.relative_to(ROOT)}"
        " (mounted there by every doc), or files the image has (/opt/gaudi-cluster/app/...)"
    )


# ---- docker build, as the docs tell it: the classic builder, run in the repository root ----------------
# Options of `docker build` that take a value (the next word, or after "=").
BUILD_OPTIONS_WITH_VALUE = frozenset(
    ("-t", "--tag", "-f", "--file", "--build-arg", "--target", "--label", "--network", "--platform",
     "--cache-from", "--iidfile", "--add-host", "--shm-size", "-m", "--memory")
)  # fmt: skip


def docker_builds(text: str) -> list[list[str]]:
    """Every `docker build ... CONTEXT` in a text (continuation lines joined), as its words."""
    builds = []
    joined = re.sub(r"\\\n\s*#?", " ", text)
    for match in re.finditer(r"docker build((?: +[^\s`|;&()]+)+)", joined):
        words = shlex.split(match.group(1), comments=True)
        builds.append(["docker", "build", *words])
    return builds


def build_context(words: list[str]) -> tuple[str | None, str | None, dict[str, str]]:
    """(context, -f file, build args) of a docker build command; context None: only a mention."""
    context = dockerfile = None
    args: dict[str, str] = {}
    rest = iter(words[2:])
    for word in rest:
        name, eq, value = word.partition("=")
        if name in BUILD_OPTIONS_WITH_VALUE:
            value = value if eq else next(rest, "")
            if name in ("-f", "--file"):
                dockerfile = value
            elif name == "--build-arg":
                key, _, val = value.partition("=")
                args[key] = val
        elif not word.startswith("-"):
            context = word
    # Prose ("docker build arguments"), not a command: no option and no path-like context.
    if context and not (any(w.startswith("-") for w in words[2:]) or context == "." or "/" in context):
        context = None
    if context and not re.fullmatch(r"[\w./${}-]+", context):
        context = None
    return context, dockerfile, args


def dockerignore(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """The context's .dockerignore as Docker reads it (moby/patternmatcher): (excludes, pattern)."""
    path = context / ".dockerignore"
    rules = []
    for raw in path.read_text().splitlines() if path.is_file() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex, i = "", 0
        while i < len(pattern):
            ch = pattern[i]
            if pattern.startswith("**", i):
                i += 2 + (pattern[i + 2 : i + 3] == "/")
                regex += ".*" if i >= len(pattern) else "(.*/)?"
                continue
            regex += {"*": "[^/]*", "?": "[^/]"}.get(ch, ch if ch in "[]-^" else re.escape(ch))
            i += 1
        rules.append((exclude, re.compile(f"^{regex}$")))
    return rules


def ignored(rules: list[tuple[bool, re.Pattern[str]]], relative: str) -> bool:
    """Excluded when the last pattern that matches the path or one of its parents excludes it."""
    parts = relative.split("/")
    verdict = False
    for exclude, pattern in rules:
        if any(pattern.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            verdict = exclude
    return verdict


def copy_sources(dockerfile: Path) -> list[tuple[int, list[str]]]:
    """(line, sources) of every COPY/ADD from the context (not --from a stage)."""
    found, lines = [], dockerfile.read_text().splitlines()
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            if not lines[i].lstrip().startswith("#"):
                line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        words = shlex.split(line, comments=True) if line.strip() else []
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(word.startswith("--from") for word in words):
            continue
        paths = [word for word in words[1:] if not word.startswith("--")]
        if len(paths) >= 2:
            found.append((start + 1, paths[:-1]))
    return found


def build_problems(words: list[str]) -> list[str]:
    context_name, dockerfile_name, args = build_context(words)
    if context_name is None or "$" in context_name:
        return []
    context = ROOT / context_name
    dockerfile = ROOT / dockerfile_name if dockerfile_name else context / "Dockerfile"
    if not context.is_dir():
        return [f"the context {context_name} is not a folder of the repository"]
    if not dockerfile.is_file():
        return [f"no Dockerfile {dockerfile.relative_to(ROOT)}"]
    problems = []
    if dockerfile == ROOT / "Dockerfile" and not {"FLAVOR", "BASE_IMAGE"} <= set(args):
        problems.append(
            "builds the node image's Dockerfile with its defaults (the cpu flavor on "
            "gaudi-cluster/debian:bookworm, which only `make base-image` makes); fix: tell `make image` or "
            "`make image-cpu`, or pass --build-arg FLAVOR=... --build-arg BASE_IMAGE=..."
        )
    rules = dockerignore(context)
    for line, sources in copy_sources(dockerfile):
        sent = []
        for source in sources:
            matches = (
                sorted(context.glob(source.rstrip("/"))) if source.rstrip("/") not in ("", ".") else [context]
            )
            sent += [m for m in matches if m == context or not ignored(rules, str(m.relative_to(context)))]
            if not any(ch in source for ch in "*?[") and not matches:
                problems.append(f"{dockerfile.name}:{line} copies {source}, which {context_name} lacks")
            elif matches and not sent and not any(ch in source for ch in "*?["):
                problems.append(f"{dockerfile.name}:{line} copies {source}, which .dockerignore leaves out")
        if not sent:
            problems.append(f"{dockerfile.name}:{line} copies nothing the context sends: {sources}")
    return problems


@pytest.mark.parametrize("doc", TEXT_NAMES)
def test_every_docker_build_a_doc_tells_finds_what_it_copies(doc):
    """Run in the repository root with the classic builder: the Dockerfile must be there, and every file
    it copies must be in the context and not left out by the context's .dockerignore."""
    problems = [f"`{shlex.join(w)}`: {p}" for w in docker_builds(texts()[doc]) for p in build_problems(w)]
    assert not problems, f"{doc}: " + "; ".join(problems)


def test_the_docker_build_make_image_runs_finds_what_it_copies():
    from gaudi_cluster.settings.profiles import load
    from gaudi_cluster.settings.profiles_build import docker_build_argv

    for profile in load().profiles.values():
        commit = profile.data["habana_deepspeed"]["commit"] or "0" * 40  # as make image resolves it
        argv = docker_build_argv(profile, "gaudi-cluster", "0.1.0", "abc", commit)
        assert build_problems(argv) == [], profile.name


def test_the_build_checks_find_what_they_are_for():
    """The checks themselves, on the mistakes they exist for."""
    assert build_problems(shlex.split("docker build -t my-job:1 .")), "the defaults of the node Dockerfile"
    rules = dockerignore(ROOT)
    assert ignored(rules, "my-code/train.py") and ignored(rules, ".keys/ca/host_ca")
    assert not ignored(rules, "app/train/run_clm.py") and not ignored(rules, "requirements/cpu-image.txt")
    assert ignored(rules, "app/train/__pycache__/x.pyc") and not ignored(rules, "build/wheelhouse/a.whl")
    assert ignored(rules, "build/wheelhouse/sub/a.whl") and ignored(rules, "requirements/dev.txt")
    assert docker_builds("x `docker build` y") == []
    assert build_context(shlex.split("docker build -t a -f b/Dockerfile --build-arg X=1 c"))[:2] == (
        "c",
        "b/Dockerfile",
    )


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_dockerfile_a_doc_shows_is_one_the_repository_has(doc):
    """A ```dockerfile block, or an inline `COPY ...`, is a repository Dockerfile's lines (its comments
    aside), so that the `docker build` of it is checked above: a recipe that exists only in the docs names
    files nobody ships."""
    repository = {
        path: {line.strip() for line in path.read_text().splitlines() if line.strip()}
        for path in ROOT.glob("**/Dockerfile")
        if ".git" not in path.parts and "build" not in path.parts
    }
    text = doc_text()[doc]
    inline = re.findall(r"`((?:FROM|COPY|ADD) [^`\n]+)`", text)
    for block in [*re.findall(r"```dockerfile\n(.*?)```", text, re.S), *inline]:
        lines = {
            line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")
        }
        homes = [path for path, have in repository.items() if lines <= have]
        assert homes, (
            f"{doc} shows a Dockerfile no repository file has ({sorted(lines)}); fix: ship it (examples/) "
            "and show its lines"
        )


@pytest.mark.parametrize("doc", sorted(doc_text()))
def test_every_image_path_of_the_app_exists(doc):
    """/opt/gaudi-cluster/app/X is the repository's app/X (the Dockerfile copies app/ there)."""
    assert "COPY app/ /opt/gaudi-cluster/app/" in (ROOT / "Dockerfile").read_text()
    named = set(re.findall(r"/opt/gaudi-cluster/app/([\w./-]*\w)", doc_text()[doc]))
    missing = sorted(p for p in named if not (ROOT / "app" / p).exists())
    assert not missing, f"{doc} names image paths that the image does not have: {missing}"
