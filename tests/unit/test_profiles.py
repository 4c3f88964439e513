"""The gaudi image profiles (app/gaudi_cluster/settings/profiles.json): internal consistency, the docker build
command `make image` renders from them, and every reader of the matrix agreeing with it."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from gaudi_cluster.aws import facts
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import probe
from gaudi_cluster.settings import profiles
from gaudi_cluster.settings.profiles_build import docker_build_argv, markdown_table
from gaudi_cluster.settings.profiles_check import consistency_problems
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
RAW = json.loads(profiles.MATRIX_PATH.read_text())
SHA = "0123456789abcdef0123456789abcdef01234567"


def matrix_with(change) -> profiles.Matrix:
    raw = copy.deepcopy(RAW)
    change(raw)
    return profiles.load(json.dumps(raw))


def test_the_matrix_is_consistent():
    assert consistency_problems(profiles.load()) == []


@pytest.mark.parametrize("name", sorted(RAW["profiles"]))
def test_the_pinned_transformers_is_in_the_range_optimum_habana_declares(name):
    profile = RAW["profiles"][name]
    declared = SpecifierSet(profile["optimum_habana"]["requires"]["transformers"])
    assert Version(profile["python_pins"]["transformers"]) in declared
    for package, spec in profile["optimum_habana"]["requires"].items():
        if package in profile["python_pins"]:
            assert Version(profile["python_pins"][package]) in SpecifierSet(spec), package


def test_todays_software_by_default_one_release_behind_and_dl1_on_1_21():
    matrix = profiles.load()
    gaudi, behind, dl1 = matrix.profile("gaudi"), matrix.profile("gaudi-1.23"), matrix.profile("dl1")
    assert matrix.default == "gaudi"
    assert (gaudi.synapse_version, gaudi.synapse_build, gaudi.data["pytorch"]) == ("1.24.1", "482", "2.11.0")
    assert gaudi.data["optimum_habana"]["version"] == RAW["facts"]["optimum_habana_final_release"] == "1.21.2"
    assert gaudi.data["habana_deepspeed"]["branch"] == "1.23.0"
    assert (behind.synapse_version, behind.data["pytorch"], behind.synapse_build) == (
        "1.23.0",
        "2.9.0",
        "695",
    )
    assert set(gaudi.generations) == set(behind.generations) == {"gaudi2", "gaudi3"}
    assert dl1.generations == ("gaudi1",) and dl1.synapse_version == "1.21.0"
    assert dl1.data["habana_deepspeed"]["commit"] == "ad4a2d0f7fed5effbda333b3ac0f9dc237e75eba"
    assert "1.21.0, not 1.21.5" in dl1.data["synapse"]["why_this_patch"]


def test_paths_are_profile_facts():
    matrix = profiles.load()
    gaudi, dl1 = matrix.profile("gaudi"), matrix.profile("dl1")
    assert gaudi.openmpi == profiles.OpenMpi("/opt/habanalabs/openmpi-5.0.8", 5, "5.0.8")
    assert gaudi.libfabric.built and gaudi.libfabric_root == "/opt/habanalabs/libfabric-1.22.0"
    assert gaudi.efa_root is None and gaudi.data["efa"]["minimal"]
    assert dl1.openmpi.root == "/opt/amazon/openmpi" and dl1.openmpi.major == 4
    assert not dl1.libfabric.built and dl1.libfabric_root == dl1.efa_root == "/opt/amazon/efa"
    assert dl1.required_paths() == {
        "Open MPI": "/opt/amazon/openmpi/bin/mpirun",
        "libfabric": "/opt/amazon/efa/lib/libfabric.so.1",
        "EFA libraries": "/opt/amazon/efa/lib",
    }
    assert set(gaudi.required_paths()) == {"Open MPI", "libfabric"}


def test_no_amazon_path_is_left_in_the_code():
    """Open MPI and EFA locations live in profiles.json; the code and the image read them from there."""
    code = [*(ROOT / "app").rglob("*.py"), *(ROOT / "image").glob("*.sh"), ROOT / "Dockerfile"]
    code += [*(ROOT / "entrypoint").glob("*"), *(ROOT / "scripts").glob("*.sh")]
    found = [
        str(path.relative_to(ROOT))
        for path in code
        if path.is_file()
        and ("/opt/amazon/openmpi" in path.read_text() or "/opt/amazon/efa" in path.read_text())
    ]
    assert found == []


def test_the_open_mpi_dialects():
    matrix = profiles.load()
    four, five = matrix.dialect(4), matrix.dialect(5)
    assert (four.rank_by, four.ssh_args, four.oob_mca) == ("core", ("--mca", "plm_rsh_args"), "--mca")
    assert (five.rank_by, five.ssh_args, five.oob_mca) == ("slot", ("--prtemca", "plm_ssh_args"), "--prtemca")
    assert matrix.openmpi_majors == (4, 5)
    with pytest.raises(ConfigError, match="Open MPI 3 is not supported"):
        matrix.dialect(3)


@pytest.mark.parametrize(
    ("name", "generation"),
    [("HL-205", "gaudi1"), ("HL-225", "gaudi2"), ("HL-225H", "gaudi2"), ("HL-325L", "gaudi3"),
     ("HL-328", "gaudi3"), ("HL-338", "gaudi3"), ("NVIDIA H200", None), (None, None)],
)  # fmt: skip
def test_the_card_generation_from_hl_smi_names(name, generation):
    assert profiles.load().generation_of(name) == generation


@pytest.mark.parametrize(
    ("generation", "driver", "profile", "ok"),
    [
        ("gaudi3", "1.24", "gaudi", True),
        ("gaudi3", "1.23", "gaudi", False),  # mixing releases: Gaudi 2 only
        ("gaudi2", "1.23", "gaudi", True),  # adjacent
        ("gaudi2", "1.22", "gaudi", False),  # two releases away
        ("gaudi1", "1.21", "dl1", True),
        (None, "1.23", "gaudi", False),
    ],
)
def test_driver_and_image_pairs(generation, driver, profile, ok):
    matrix = profiles.load()
    assert (matrix.pairs_with(matrix.profile(profile), generation, driver) is None) is ok


def test_fitting_profiles_for_a_driver():
    matrix = profiles.load()
    assert matrix.fitting_profiles("gaudi3", "1.23") == ["gaudi-1.23"]
    assert matrix.fitting_profiles("gaudi2", "1.23") == ["gaudi", "gaudi-1.23"]
    assert matrix.fitting_profiles("gaudi1", "1.21") == ["dl1"]
    assert matrix.fitting_profiles("gaudi3", "1.21") == []


def _set(path: str, value):
    def change(raw):
        *parents, key = path.split("/")
        node = raw
        for part in parents:
            node = node[part]
        node[key] = value

    return change


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (_set("profiles/gaudi/python_pins/transformers", "4.56.0"), "transformers 4.56.0"),
        (_set("profiles/dl1/pytorch", "2.7.1"), "base_image"),
        (_set("profiles/gaudi-1.23/habana_deepspeed/branch", "1.24.0"), "newer than the Synapse release"),
        (_set("profiles/gaudi/habana_deepspeed/branch", "1.21.0"), "asks for DeepSpeed 1.23.0"),
        (_set("profiles/dl1/habana_deepspeed/commit", "abc"), "not a full SHA"),
        (_set("profiles/dl1/habana_deepspeed/commit", SHA), "does not start with its prefix"),
        (
            _set("profiles/dl1/habana_deepspeed/version", "0.16.1+hpu.synapse.v1.20.0"),
            "not built from branch",
        ),
        (_set("profiles/gaudi/habana_deepspeed/commit_note", ""), "no commit and no commit_note"),
        (_set("profiles/gaudi/optimum_habana/validated_synapse", "1.23.0"), "validated"),
        (_set("profiles/dl1/habana_torch_plugin", "1.21.0.1"), "habana_torch_plugin"),
        (_set("profiles/gaudi/hccl_ofi_wrapper/interface", "no-destructor"), "interface"),
        (_set("profiles/gaudi/hccl_ofi_wrapper/commit", "v1.18.0"), "not a full SHA"),
        (_set("profiles/gaudi/generations", ["gaudi1", "gaudi2"]), "first-gen Gaudi"),
        (_set("profiles/dl1/generations", ["gaudi2"]), "no profile runs gaudi1"),
        (_set("profiles/dl1/python_pins/optimum", "2.3.0"), "optimum 2.3.0"),
        (_set("default", "gaudi3"), "default profile"),
        (_set("profiles/gaudi/openmpi/major", 4), "Open MPI 4 does not match Synapse 1.24.1"),
        (_set("profiles/dl1/openmpi/major", 5), "Open MPI 5 does not match Synapse 1.21.0"),
        (_set("profiles/gaudi/openmpi/root", "/opt/habanalabs/openmpi"), "does not name its version"),
        (_set("profiles/gaudi/openmpi/version", "4.1.6"), "is not major 5"),
        (_set("profiles/gaudi/libfabric/sha256", "abc"), "needs its release tarball url and sha256"),
        (_set("profiles/gaudi/libfabric/root", "/opt/fabric"), "does not name the version built"),
        (_set("profiles/dl1/efa/minimal", True), "must be the base's full EFA installation"),
        (_set("profiles/gaudi/presets", ["gaudinic", "efa"]), "the efa preset needs the EFA libraries"),
        (_set("profiles/dl1/libfabric/root", "efa"), "is not absolute"),
    ],
)
def test_every_broken_link_is_named(change, problem):
    problems = consistency_problems(matrix_with(change))
    assert any(problem in p for p in problems), problems


def test_the_profile_check_fails_the_build_on_a_mismatch(tmp_path, monkeypatch):
    broken = copy.deepcopy(RAW)
    broken["profiles"]["gaudi"]["openmpi"]["major"] = 4
    matrix_file = tmp_path / "profiles.json"
    matrix_file.write_text(json.dumps(broken))
    monkeypatch.setattr(profiles, "MATRIX_PATH", matrix_file)
    from gaudi_cluster.settings import profiles_cli

    assert profiles_cli.main(["check"]) == 1


@pytest.mark.parametrize(
    "spec",
    [">=4.51.0,<4.52.0", "~=2.0", "~=1.25", "==3.3.1", ">=1.7.0", "!=1.2", ">1.0,<=2.0", ">=1.7.0,<=1.10.1"],
)
@pytest.mark.parametrize(
    "version",
    [
        "4.51.0",
        "4.51.3",
        "4.52.0",
        "2.0",
        "2.3.0",
        "3.0.0",
        "1.25.0",
        "1.27.0",
        "3.3.1",
        "1.2",
        "2.0.1",
        "1.10.1",
    ],
)
def test_satisfies_agrees_with_packaging(spec, version):
    assert profiles.satisfies(version, spec) == (Version(version) in SpecifierSet(spec))


def test_the_dl1_synapse_of_aws_comes_from_the_matrix():
    assert facts.SYNAPSE_PROFILE == profiles.load().profile("dl1").synapse_release == "1.21"
    assert facts.DEFAULT_IMAGE == "gaudi-cluster:dl1"


def make_image(profile: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "image", f"PROFILE={profile}", "GIT_REV=abc1234", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def make_image_dry_run(profile: str, *extra: str) -> tuple[list[str], list[str]]:
    """(the docker build argv, the summary lines) that `make image DRY_RUN=1` prints."""
    done = make_image(profile, "DRY_RUN=1", *extra)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return shlex.split(lines[-1]), [line for line in lines if line.startswith("# ")]


def build_args(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--build-arg"]
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.mark.parametrize("name", sorted(RAW["profiles"]))
def test_make_image_renders_the_profiles_docker_build(name):
    profile = profiles.load().profile(name)
    argv, summary = make_image_dry_run(name)
    assert argv[:2] == ["docker", "build"] and argv[-1] == "."
    tags = [argv[i + 1] for i, word in enumerate(argv) if word == "-t"]
    assert tags == [f"gaudi-cluster:{name}", f"gaudi-cluster:0.1.0-{name}-{profile.synapse_version}-abc1234"]
    args = build_args(argv)
    assert args["BASE_IMAGE"] == profile.data["base_image"]
    assert args["FLAVOR"] == "gaudi" and args["DS_ACCELERATOR"] == "hpu" and args["PROFILE"] == name
    assert (args["SYNAPSE_VERSION"], args["PT_VERSION"]) == (profile.synapse_version, profile.data["pytorch"])
    assert args["HCCL_OFI_WRAPPER_COMMIT"] == "bea1d6f65e2be76f5f703403787cb8a3fde5ebaa"
    assert args["HCCL_OFI_WRAPPER_INTERFACE"] == "destructor"
    assert (args["OPENMPI_ROOT"], args["OPENMPI_MAJOR"]) == (profile.openmpi.root, str(profile.openmpi.major))
    assert args["LIBFABRIC_ROOT"] == profile.libfabric_root and args["EFA_ROOT"] == (profile.efa_root or "")
    assert args["LIBFABRIC_SOURCE"] == ("build" if profile.libfabric.built else "base")
    pins = dict(pin.split("==") for pin in args["PYTHON_PINS"].split())
    assert pins == {**profile.data["python_pins"], **profile.data["control_plane_pins"]}
    # The summary says the same: the base tag, the release, the wheels and the paths.
    text = "\n".join(summary)
    assert profile.data["base_image"] in text and f"PyTorch {profile.data['pytorch']}" in text
    assert args["PYTHON_PINS"] in text and profile.openmpi.root in text and profile.libfabric_root in text
    assert argv == docker_build_argv(profile, "gaudi-cluster", "0.1.0", "abc1234")


def test_the_pinned_fork_is_installed_by_commit():
    args = build_args(make_image_dry_run("dl1")[0])
    assert (
        args["HABANA_DEEPSPEED_REF"]
        == args["HABANA_DEEPSPEED_COMMIT_PREFIX"]
        == RAW["profiles"]["dl1"]["habana_deepspeed"]["commit"]
    )
    assert args["HABANA_DEEPSPEED_VERSION"] == "0.16.1+hpu.synapse.v1.21.0"


def test_an_unrecorded_fork_is_resolved_by_the_build_and_a_dry_run_says_how(tmp_path):
    argv, summary = make_image_dry_run("gaudi", f"PINS_DIR={tmp_path}")
    args = build_args(argv)
    assert (args["HABANA_DEEPSPEED_REF"], args["HABANA_DEEPSPEED_COMMIT_PREFIX"]) == ("1.23.0", "")
    assert args["HABANA_DEEPSPEED_VERSION"] == "*+hpu.synapse.v1.23.0"
    assert args["HABANA_DEEPSPEED_REPO"] == RAW["facts"]["deepspeed_fork_repo"]
    text = "\n".join(summary)
    assert "git ls-remote -- https://github.com/HabanaAI/DeepSpeed.git refs/heads/1.23.0" in text
    assert f"recorded in {tmp_path}/gaudi.env" in text and "io.gaudi-cluster.habana-deepspeed.commit" in text
    # A fork that cannot be resolved: one line naming the fix, no docker build.
    refused = make_image("gaudi", f"PINS_DIR={tmp_path}", f"HABANA_DEEPSPEED_REPO={tmp_path}/none.git")
    assert refused.returncode != 0 and "docker build" not in refused.stdout
    error = [line for line in refused.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "cannot resolve Habana DeepSpeed branch 1.23.0" in error[0]
    assert "fix: make image HABANA_DEEPSPEED_COMMIT=" in error[0]
    given = build_args(make_image_dry_run("gaudi", f"HABANA_DEEPSPEED_COMMIT={SHA}")[0])
    assert given["HABANA_DEEPSPEED_REF"] == given["HABANA_DEEPSPEED_COMMIT_PREFIX"] == SHA
    wrong = make_image("dl1", "DRY_RUN=1", f"HABANA_DEEPSPEED_COMMIT={SHA}")
    assert wrong.returncode != 0 and "is not the profile's ad4a2d0f" in wrong.stderr


def test_every_build_arg_is_declared_in_the_dockerfile():
    dockerfile = (ROOT / "Dockerfile").read_text()
    declared = {line.split()[1].split("=")[0] for line in dockerfile.splitlines() if line.startswith("ARG ")}
    for profile in RAW["profiles"]:
        assert set(build_args(make_image_dry_run(profile)[0])) <= declared


def test_make_image_refuses_an_unknown_profile():
    done = make_image("gaudi4", "DRY_RUN=1")
    assert done.returncode != 0
    assert "profile 'gaudi4' is unknown; fix: use one of gaudi, gaudi-1.23, dl1" in done.stderr


@pytest.mark.parametrize("doc", ["README.md", "docs/gaudi.md"])
def test_the_docs_table_is_the_one_the_matrix_renders(doc):
    assert markdown_table(profiles.load()) in (ROOT / doc).read_text()


def test_unknown_profile_and_key_are_config_errors():
    matrix = profiles.load()
    with pytest.raises(ConfigError, match="fix:"):
        matrix.profile("gaudi4")
    with pytest.raises(ConfigError, match=r"no 'synapse\.patch'"):
        matrix.profile("dl1").get("synapse.patch")
    assert matrix.profile("dl1").get("synapse.build") == "555"


def test_image_profile_file(tmp_path):
    assert probe.image_profile(tmp_path / "missing") is None
    (tmp_path / "PROFILE").write_text("dl1\n")
    assert probe.image_profile(tmp_path / "PROFILE") == "dl1"


@pytest.mark.parametrize("name", sorted(RAW["profiles"]))
def test_the_optimum_habana_test_lock_pins_the_profile(name):
    lock = (ROOT / "requirements" / f"ohabana-{name}.txt").read_text()
    pins = dict(line.split("==") for line in lock.splitlines() if line.strip() and not line.startswith("#"))
    normalized = {key.lower().replace("_", "-"): value for key, value in pins.items()}
    for package, version in RAW["profiles"][name]["python_pins"].items():
        assert normalized[package.lower().replace("_", "-")] == version, package
