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
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
RAW = json.loads(profiles.MATRIX_PATH.read_text())


def matrix_with(change) -> profiles.Matrix:
    raw = copy.deepcopy(RAW)
    change(raw)
    return profiles.load(json.dumps(raw))


def test_the_matrix_is_consistent():
    assert profiles.consistency_problems(profiles.load()) == []


@pytest.mark.parametrize("name", sorted(RAW["profiles"]))
def test_the_pinned_transformers_is_in_the_range_optimum_habana_declares(name):
    profile = RAW["profiles"][name]
    declared = SpecifierSet(profile["optimum_habana"]["requires"]["transformers"])
    assert Version(profile["python_pins"]["transformers"]) in declared
    for package, spec in profile["optimum_habana"]["requires"].items():
        if package in profile["python_pins"]:
            assert Version(profile["python_pins"][package]) in SpecifierSet(spec), package


def test_each_generation_has_its_profile_and_gaudi1_stays_on_1_21():
    matrix = profiles.load()
    dl1, gaudi = matrix.profile("dl1"), matrix.profile("gaudi")
    assert dl1.data["generations"] == ["gaudi1"] and dl1.synapse_release == "1.21"
    assert set(gaudi.data["generations"]) == {"gaudi2", "gaudi3"} and gaudi.synapse_release == "1.22"
    assert matrix.default == "gaudi"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda m: m["profiles"]["gaudi"]["python_pins"].update(transformers="4.52.0"),
            "transformers 4.52.0",
        ),
        (lambda m: m["profiles"]["dl1"].update(pytorch="2.7.1"), "base_image"),
        (lambda m: m["profiles"]["gaudi"]["habana_deepspeed"].update(branch="1.21.0"), "branch 1.21.0"),
        (lambda m: m["profiles"]["gaudi"]["habana_deepspeed"].update(commit="abc"), "not a full SHA"),
        (lambda m: m["profiles"]["gaudi"]["optimum_habana"].update(validated_synapse="1.21.0"), "validated"),
        (lambda m: m["profiles"]["dl1"]["optimum_habana"].update(deepspeed_branch="1.22.0"), "asks for"),
        (lambda m: m["profiles"]["dl1"].update(habana_torch_plugin="1.21.0.1"), "habana_torch_plugin"),
        (lambda m: m["profiles"]["gaudi"]["hccl_ofi_wrapper"].update(interface="no-destructor"), "interface"),
        (lambda m: m["profiles"]["gaudi"]["hccl_ofi_wrapper"].update(commit="v1.18.0"), "not a full SHA"),
        (lambda m: m["profiles"]["gaudi"]["generations"].append("gaudi1"), "first-gen Gaudi"),
        (lambda m: m["profiles"]["dl1"].update(generations=["gaudi2"]), "no profile runs gaudi1"),
        (lambda m: m["profiles"]["dl1"]["python_pins"].update(optimum="2.3.0"), "optimum 2.3.0"),
        (lambda m: m.update(default="gaudi3"), "default profile"),
    ],
)
def test_every_broken_link_is_named(change, problem):
    problems = profiles.consistency_problems(matrix_with(change))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "spec", [">=4.51.0,<4.52.0", "~=2.0", "~=1.25", "==3.3.1", ">=1.7.0", "!=1.2", ">1.0,<=2.0"]
)
@pytest.mark.parametrize(
    "version",
    ["4.51.0", "4.51.3", "4.52.0", "2.0", "2.3.0", "3.0.0", "1.25.0", "1.27.0", "3.3.1", "1.2", "2.0.1"],
)
def test_satisfies_agrees_with_packaging(spec, version):
    assert profiles.satisfies(version, spec) == (Version(version) in SpecifierSet(spec))


def test_the_dl1_synapse_of_aws_comes_from_the_matrix():
    assert facts.SYNAPSE_PROFILE == profiles.load().profile("dl1").synapse_release == "1.21"
    assert facts.DEFAULT_IMAGE == "gaudi-cluster:dl1"


def make_image_dry_run(profile: str) -> list[str]:
    done = subprocess.run(
        ["make", "-s", "image", f"PROFILE={profile}", "DRY_RUN=1", "GIT_REV=abc1234"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return shlex.split(done.stdout.strip().splitlines()[-1])


def build_args(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--build-arg"]
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.mark.parametrize(
    ("profile", "base", "synapse", "deepspeed_ref", "optimum_habana"),
    [
        (
            "gaudi",
            "vault.habana.ai/gaudi-docker/1.22.0/ubuntu22.04/habanalabs/pytorch-installer-2.7.1:1.22.0-740",
            "1.22.0",
            "1.22.0",
            "1.19.1",
        ),
        (
            "dl1",
            "vault.habana.ai/gaudi-docker/1.21.0/ubuntu22.04/habanalabs/pytorch-installer-2.6.0:1.21.0-555",
            "1.21.0",
            "ad4a2d0f7fed5effbda333b3ac0f9dc237e75eba",
            "1.18.1",
        ),
    ],
)
def test_make_image_renders_the_profiles_docker_build(profile, base, synapse, deepspeed_ref, optimum_habana):
    argv = make_image_dry_run(profile)
    assert argv[:2] == ["docker", "build"] and argv[-1] == "."
    tags = [argv[i + 1] for i, word in enumerate(argv) if word == "-t"]
    assert tags == [f"gaudi-cluster:{profile}", f"gaudi-cluster:0.1.0-{profile}-{synapse}-abc1234"]
    args = build_args(argv)
    assert args["BASE_IMAGE"] == base
    assert args["FLAVOR"] == "gaudi" and args["DS_ACCELERATOR"] == "hpu" and args["PROFILE"] == profile
    assert args["SYNAPSE_VERSION"] == synapse
    assert args["HABANA_DEEPSPEED_REF"] == deepspeed_ref
    assert args["HCCL_OFI_WRAPPER_COMMIT"] == "bea1d6f65e2be76f5f703403787cb8a3fde5ebaa"
    assert args["HCCL_OFI_WRAPPER_INTERFACE"] == "destructor"
    assert args["LIBFABRIC_ROOT"] == "/opt/amazon/efa"
    pins = dict(pin.split("==") for pin in args["PYTHON_PINS"].split())
    assert pins["optimum-habana"] == optimum_habana and pins["transformers"] == "4.51.3"


def test_every_build_arg_is_declared_in_the_dockerfile():
    dockerfile = (ROOT / "Dockerfile").read_text()
    declared = {line.split()[1].split("=")[0] for line in dockerfile.splitlines() if line.startswith("ARG ")}
    for profile in ("gaudi", "dl1"):
        assert set(build_args(make_image_dry_run(profile))) <= declared


def test_make_image_refuses_an_unknown_profile():
    done = subprocess.run(
        ["make", "-s", "image", "PROFILE=gaudi4", "DRY_RUN=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "profile 'gaudi4' is unknown; fix: use one of gaudi, dl1" in done.stderr


@pytest.mark.parametrize("doc", ["README.md", "docs/gaudi.md"])
def test_the_docs_table_is_the_one_the_matrix_renders(doc):
    assert profiles.markdown_table(profiles.load()) in (ROOT / doc).read_text()


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
