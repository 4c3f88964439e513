"""Configuration layering (flags > GAUDI_CLUSTER_* > defaults) and the CLI called in-process."""

from __future__ import annotations

import pytest
from gaudi_cluster.cli import main
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.config import ClusterConfig, resolve_config


def test_flags_win_over_env_and_env_over_defaults():
    config = resolve_config(
        {"ssh_port": "2022", "nodes": None},
        {"GAUDI_CLUSTER_SSH_PORT": "4022", "GAUDI_CLUSTER_NODES": "4", "GC_KERNEL_PATH": "/x"},
    )
    assert config.ssh_port == 2022
    assert config.nodes == 4
    assert config.master_port == ClusterConfig().master_port


def test_env_pass_names_from_the_flag_and_the_variable_add_up():
    """run-node.sh, the sbatch and the manifests give the master's container every name of both: a
    name in GAUDI_CLUSTER_ENV_PASS must reach the ranks even when the command line names another."""
    env = {"GAUDI_CLUSTER_ENV_PASS": "HF_TOKEN,WANDB_API_KEY"}
    assert resolve_config({"env_pass": ["MY_TOKEN", "HF_TOKEN"]}, env).env_pass == (
        "HF_TOKEN",
        "WANDB_API_KEY",
        "MY_TOKEN",
    )
    assert resolve_config({}, env).env_pass == ("HF_TOKEN", "WANDB_API_KEY")
    assert resolve_config({"env_pass": ["MY_TOKEN"]}, {}).env_pass == ("MY_TOKEN",)
    with pytest.raises(ConfigError, match="GAUDI_CLUSTER_ENV_PASS"):
        resolve_config({"env_pass": ["MY_TOKEN"]}, {"GAUDI_CLUSTER_ENV_PASS": "HF TOKEN"})


@pytest.mark.parametrize(
    ("flags", "env", "culprit"),
    [
        ({"ssh_port": "0"}, {}, "--ssh-port"),
        ({}, {"GAUDI_CLUSTER_MASTER_PORT": "99999"}, "GAUDI_CLUSTER_MASTER_PORT"),
        ({}, {"GAUDI_CLUSTER_NODES": "three"}, "GAUDI_CLUSTER_NODES"),
        ({}, {"GAUDI_CLUSTER_LAUNCHER": "srun"}, "GAUDI_CLUSTER_LAUNCHER"),
        ({}, {"GAUDI_CLUSTER_SKIP_DOCTOR": "maybe"}, "GAUDI_CLUSTER_SKIP_DOCTOR"),
        ({"wait_timeout": "-1"}, {}, "--wait-timeout"),
    ],
)
def test_bad_settings_name_their_source_and_fix(flags, env, culprit):
    with pytest.raises(ConfigError) as error:
        resolve_config(flags, env)
    message = str(error.value)
    assert culprit in message and "fix:" in message and "\n" not in message


def test_describe_lists_only_changed_settings():
    assert "ssh_port=2222" in ClusterConfig(ssh_port=2222).describe()
    assert ClusterConfig().describe().endswith("all defaults")


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in ("master", "spawn", "doctor", "probe", "reap", "hostfile"):
        assert command in out


def test_hostfile_command_validates(tmp_path, capsys):
    good = tmp_path / "good"
    good.write_text("# comment\n\nb slots=2\na slots=1  # trailing\n")
    assert main(["hostfile", str(good)]) == 0
    assert capsys.readouterr().out == "b slots=2\na slots=1\n"
    bad = tmp_path / "bad"
    bad.write_text("a slots=1\na slots=2\n")
    assert main(["hostfile", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad}:2" in err[0]


def test_master_bad_env_exits_2_before_anything(monkeypatch, capsys):
    monkeypatch.setenv("GAUDI_CLUSTER_MASTER_PORT", "70000")
    assert main(["master"]) == 2
    assert "GAUDI_CLUSTER_MASTER_PORT" in capsys.readouterr().err


def test_seed_command_dry_run_reaches_every_host(tmp_path, monkeypatch, capsys):
    """gaudi_spawn.py --hostfile H --use_deepspeed run_clm.py … --deepspeed cfg, as the seed types it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run_clm.py").write_text("")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("10.0.0.1 slots=8\n10.0.0.2 slots=8\n")
    seed_args = [
        "--model_name_or_path",
        "gpt2-xl",
        "--gaudi_config_name",
        "Habana/gpt2",
        "--dataset_name",
        "wikitext",
        "--dataset_config_name",
        "wikitext-2-raw-v1",
        "--do_train",
        "--output_dir",
        "/tmp/gpt2_xl_multi_node",
        "--learning_rate",
        "4e-04",
        "--per_device_train_batch_size",
        "16",
        "--gradient_checkpointing",
        "--num_train_epochs",
        "1",
        "--use_habana",
        "--use_lazy_mode",
        "--throughput_warmup_steps",
        "3",
        "--deepspeed",
        "ds_config.json",
    ]
    monkeypatch.setenv("GAUDI_CLUSTER_SSH_PORT", "3022")
    code = main(
        ["spawn", "--dry-run", "--hostfile", str(hostfile), "--use_deepspeed", "run_clm.py", *seed_args]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "10.0.0.1 slots=8\n10.0.0.2 slots=8\n" in out
    command = out.split("# command\n", 1)[1]
    assert "--hostfile" in command and "--master_addr 10.0.0.1" in command
    assert "--master_port 29500" in command and "--ssh_port 3022" in command
    assert command.rstrip().endswith(" ".join(seed_args[-4:]))


def test_a_peer_source_flag_replaces_the_env_sources():
    config = resolve_config({"hostfile": "/job/hostfile"}, {"GAUDI_CLUSTER_PEERS_DNS": "worker"})
    assert (config.hostfile, config.peers_dns, config.peers) == ("/job/hostfile", None, None)
    both_env = resolve_config({}, {"GAUDI_CLUSTER_PEERS_DNS": "worker", "GAUDI_CLUSTER_PEERS": "a"})
    assert (both_env.peers_dns, both_env.peers) == ("worker", "a")  # still a conflict, reported later


def test_secrets_in_extra_env_never_reach_the_log_line():
    env = (("HF_TOKEN", "hf_secret"), ("AWS_SECRET_ACCESS_KEY", "x"), ("FOO", "1"))
    line = ClusterConfig(env=env).describe()
    assert "hf_secret" not in line and "=x" not in line
    assert "HF_TOKEN=***" in line and "FOO=1" in line
