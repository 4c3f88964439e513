"""`gaudi-cluster aws` before any cloud call: flags, bad input, boto3 missing, credentials missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gaudi_cluster.aws import cli, ec2

ROOT = Path(__file__).resolve().parents[2]
PLAN = ["plan", "--nodes", "2", "--ssh-cidr", "203.0.113.7/32", "--key-name", "me"]


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to reach AWS fails the test: these inputs must be refused before that."""

    def refuse(region):
        raise AssertionError(f"connected to AWS ({region}) for input that should have been refused")

    monkeypatch.setattr(ec2, "connect", refuse)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("gaudi-cluster: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["plan", "--nodes", "0", "--ssh-cidr", "203.0.113.7/32", "--key-name", "me"],
            "--nodes 0: a cluster needs at least one node; fix: --nodes 2",
        ),
        (
            ["plan", "--nodes", "two"],
            "argument --nodes: invalid int value: 'two'; fix: gaudi-cluster aws plan --help",
        ),
        (
            ["plan", "--node", "2"],
            "gaudi-cluster aws plan: unknown flag '--node'; fix: --nodes (gaudi-cluster aws plan --help",
        ),
        (["up", "--nodes", "2", "--placement-group", "spread"], "argument --placement-group: invalid choice"),
        (
            ["plan", "--nodes", "2", "--key-name", "me"],
            "--key-delivery ssh needs ssh ingress from your address; fix: --ssh-cidr",
        ),
        (["plan", *PLAN[1:], "--ssh-cidr", "0.0.0.0/0"], "would open ssh to the whole internet"),
        (
            ["plan", *PLAN[1:], "--ssh-cidr", "0.0.0.0/1"],
            "--ssh-cidr 0.0.0.0/1 is wider than /16 (2,147,483,648 addresses could try port 22); "
            "fix: --ssh-cidr YOUR.IP.ADDR.ESS/32, or --allow-wide-ssh-source if that is meant",
        ),
        (["up", *PLAN[1:], "--ssh-cidr", "10.0.0.0/8"], "--ssh-cidr 10.0.0.0/8 is wider than /16"),
        (
            ["up", *PLAN[1:], "--keys", "/nonexistent/keys"],
            "no cluster key in /nonexistent/keys; fix: make keys",
        ),
        (["plan", *PLAN[1:], "--key-delivery", "ssm"], "--key-delivery ssm reads from AWS on the nodes"),
        (["down", "Bad_Id"], "cluster id 'Bad_Id'"),
        (["down", "--cluster-id", "Bad_Id"], "cluster id 'Bad_Id'"),  # as plan and up take it
        (["status", "a", "--cluster-id", "b"], "named twice"),
        (["status", "demo", "--region", "moon"], "--region 'moon' is not an AWS region name"),
        (["launch"], "invalid choice: 'launch'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_reaches_no_cloud(offline, capsys, argv, fragment):
    assert cli.main(argv) == 2
    line = error_line(capsys)
    assert fragment in line
    assert "; fix: " in line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # Named before argparse's own complaint (the required --nodes) would hide it.
        (["up", "--bogus"], "gaudi-cluster aws up: unknown flag '--bogus'; fix: gaudi-cluster aws up --help"),
        (
            ["status", "demo", "--cluster", "x"],
            "gaudi-cluster aws status: unknown flag '--cluster'; fix: --cluster-id "
            "(gaudi-cluster aws status --help lists every flag)",
        ),
        (
            ["down", "--wait-timeot=30"],
            "gaudi-cluster aws down: unknown flag '--wait-timeot'; fix: --wait-timeout "
            "(gaudi-cluster aws down --help lists every flag)",
        ),
        (
            ["plan", *PLAN[1:], "--region-name", "us-east-1"],
            "gaudi-cluster aws plan: unknown flag '--region-name'; fix: --region "
            "(gaudi-cluster aws plan --help lists every flag)",
        ),
        (["--verbose", "plan"], "gaudi-cluster aws: unknown flag '--verbose'; fix: gaudi-cluster aws --help"),
        # A flag of another subcommand is unknown to this one (--keys is up's).
        (["plan", *PLAN[1:], "--keys", ".keys"], "gaudi-cluster aws plan: unknown flag '--keys'"),
        # Quoted and safe: a terminal escape in the flag reaches no terminal raw.
        (["plan", "--\x1b[2Jx"], "gaudi-cluster aws plan: unknown flag"),
    ],
)
def test_an_unknown_flag_is_named_with_the_closest_one_and_exit_2(offline, capsys, argv, line):
    assert cli.main(argv) == 2
    shown = error_line(capsys)
    assert shown.startswith(f"gaudi-cluster: error: {line}"), shown
    assert "\x1b" not in shown


def test_values_that_look_like_flags_are_left_to_the_checks_of_their_flag(offline, capsys):
    assert cli.main(["plan", "--nodes", "-1", *PLAN[3:]]) == 2
    assert "--nodes -1: a cluster needs at least one node" in error_line(capsys)


@pytest.mark.parametrize("command", ["plan", "up"])
def test_a_wide_ssh_source_is_taken_when_the_user_says_so(offline, command, cluster_keys):
    # Past every input check: the next step is connecting to AWS (refused by the `offline` fixture).
    argv = [command, *PLAN[1:], "--ssh-cidr", "0.0.0.0/1", "--allow-wide-ssh-source"]
    argv += ["--keys", str(cluster_keys)] if command == "up" else []
    with pytest.raises(AssertionError, match="connected to AWS"):
        cli.main(argv)


def test_up_refuses_a_missing_run_node_script(offline, capsys, cluster_keys, tmp_path):
    argv = ["up", *PLAN[1:], "--keys", str(cluster_keys), "--run-node", str(tmp_path / "run-node.sh")]
    assert cli.main(argv) == 2
    assert "run-node.sh not found" in error_line(capsys)


def test_missing_boto3_is_one_line_with_the_install_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "boto3", None)
    assert cli.main(PLAN) == 2
    assert error_line(capsys) == (
        "gaudi-cluster: error: gaudi-cluster aws needs boto3, which is not installed; "
        "fix: pip install 'gaudi-cluster[aws]'"
    )


def test_missing_credentials_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert cli.main(PLAN) == 2
    assert error_line(capsys).endswith(
        "no AWS credentials found; fix: aws configure "
        "(or set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    )


def test_an_unknown_region_is_refused_before_any_call(monkeypatch, capsys):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert cli.main([*PLAN, "--region", "xx-nowhere-9"]) == 2
    assert "--region xx-nowhere-9 is not an EC2 region; fix: --region us-east-1" in error_line(capsys)


def test_importing_the_cli_does_not_import_boto3():
    probe = "import sys, gaudi_cluster.aws.cli; print('boto3' in sys.modules, 'botocore' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "app")},
    )
    assert done.stdout.split() == ["False", "False"]


def test_help_and_no_command(capsys):
    assert cli.main(["--help"]) == 0
    assert "plan" in capsys.readouterr().out
    assert cli.main([]) == 2
