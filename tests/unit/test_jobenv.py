"""What the ranks get of the environment: the secret check, the user's .deepspeed_env, --env-pass."""

from __future__ import annotations

import pytest
from gaudi_cluster.env import cpu_threads
from gaudi_cluster.env.envfile import EnvFile, is_secret
from gaudi_cluster.env.jobenv import (
    UserEnvFile,
    describe,
    job_env,
    private_values,
    read_user_env_files,
    user_env_paths,
)
from gaudi_cluster.errors import ConfigError

from tests.support.reports import as_reports

SECRETS = [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "WANDB_API_KEY", "OPENAI_API_KEY", "DB_PASSWORD", "PGPASSWORD", "MYSQL_PASSWD", "SSH_KEY",
    "SSH_PRIVATE_KEY_PEM", "CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CREDENTIAL",
    "SIGNING_KEY", "hf_token", "MY_PASSPHRASE", "KEY", "COMET_APIKEY",
]  # fmt: skip
NOT_SECRETS = [
    "TOKENIZERS_PARALLELISM", "KEYBOARD", "MONKEY", "HCCL_KEYS", "MAX_TOKENS", "AWS_ACCESS_KEY_ID",
    "WANDB_API_KEY_FILE", "SSH_KEY_PATH", "HF_HOME", "HCCL_SOCKET_IFNAME", "PT_HPU_LAZY_MODE",
    "KEYCLOAK_URL", "SECRETARY", "TOKENIZER_NAME", "PASSTHROUGH", "DONKEY_COUNT", "HOTKEY", "PWD",
    "LD_LIBRARY_PATH", "CRED_DIR",
]  # fmt: skip


@pytest.mark.parametrize("name", SECRETS)
def test_secret_names_are_caught(name):
    assert is_secret(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_other_names_are_not_secrets(name):
    assert not is_secret(name)


def test_the_table_is_big_enough_both_ways():
    assert len(SECRETS) >= 15 and len(NOT_SECRETS) >= 15 and len(SECRETS) + len(NOT_SECRETS) >= 30


def test_user_env_files_are_where_deepspeed_reads_them():
    assert user_env_paths({}, "/root", "/w") == ["/root/.deepspeed_env", "/w/.deepspeed_env"]
    assert user_env_paths({"DS_ENV_FILE": "my.env"}, "/root", "/w") == ["/root/my.env", "/w/my.env"]
    assert user_env_paths({"DS_ENV_FILE": "/etc/x.env"}, "/root", "/w") == ["/etc/x.env"]
    files = {"/root/.deepspeed_env": "A=home\nB=home\n", "/w/.deepspeed_env": "# mine\n\nB=cwd\n"}
    found = read_user_env_files({}, "/root", "/w", files.get)
    assert [(f.path, f.values) for f in found] == [
        ("/root/.deepspeed_env", (("A", "home"), ("B", "home"))),
        ("/w/.deepspeed_env", (("B", "cwd"),)),
    ]


def compose(user_files=(), env_pass=(), environ=None, extra=None):
    return job_env(
        preset="cpu",
        accelerator="cpu",
        master_report={},
        environ=environ or {},
        socket_ifname="eth0",
        extra=extra or {},
        user_files=user_files,
        env_pass=env_pass,
    )


def test_the_users_file_wins_over_the_preset_and_the_later_file_wins():
    files = [
        UserEnvFile("/root/.deepspeed_env", (("DS_ACCELERATOR", "hpu"), ("MY_FLAG", "home"))),
        UserEnvFile("/w/.deepspeed_env", (("MY_FLAG", "cwd"),)),
    ]
    env = compose(files)
    assert env.as_dict()["DS_ACCELERATOR"] == "hpu"
    assert env.as_dict()["MY_FLAG"] == "cwd"
    assert set(env.overridden) == {"DS_ACCELERATOR", "MY_FLAG"}
    lines = describe(env, files)
    assert lines[0].startswith("from /root/.deepspeed_env, /w/.deepspeed_env: DS_ACCELERATOR, MY_FLAG")
    assert "hpu" not in " ".join(lines) and "cwd" not in " ".join(lines)


def test_explicit_env_wins_over_the_users_file():
    env = compose([UserEnvFile("/w/.deepspeed_env", (("A", "file"),))], extra={"A": "flag"})
    assert env.as_dict()["A"] == "flag"


def test_secrets_and_unsafe_values_from_the_file_travel_privately():
    files = [UserEnvFile("/w/.deepspeed_env", (("HF_TOKEN", "hf_abc"), ("WEIRD", "a$b"), ("OK", "1")))]
    env = compose(files)
    assert dict(env.private) == {"HF_TOKEN": "hf_abc", "WEIRD": "a$b"}
    assert "HF_TOKEN" not in env.as_dict() and "WEIRD" not in env.as_dict() and env.as_dict()["OK"] == "1"
    line = next(line for line in describe(env, files) if "privately" in line)
    assert "HF_TOKEN" in line and "hf_abc" not in line
    assert private_values(files, (), {}) == dict(env.private)


def test_launcher_owned_names_in_the_file_are_reported_not_used():
    files = [UserEnvFile("/w/.deepspeed_env", (("MASTER_ADDR", "1.2.3.4"),))]
    env = compose(files)
    assert "MASTER_ADDR" not in env.as_dict()
    warning = next(line for line in describe(env, files) if line.startswith("warning:"))
    assert "MASTER_ADDR" in warning and "fix:" in warning


def test_env_pass_forwards_a_secret_on_purpose_and_nothing_is_dropped_silently():
    environ = {"HF_TOKEN": "hf_abc", "HF_API_KEY": "k", "HF_HOME": "/hf", "HCCL_X": "a`b`"}
    env = compose(env_pass=("HF_TOKEN",), environ=environ)
    assert dict(env.private) == {"HF_TOKEN": "hf_abc"}
    assert env.as_dict()["HF_HOME"] == "/hf"
    warning = next(line for line in describe(env, []) if line.startswith("warning:"))
    assert "HF_API_KEY (looks like a secret)" in warning and "HCCL_X" in warning
    assert "HF_TOKEN" not in warning and "--env-pass HF_API_KEY" in warning
    # gaudi_spawn.py and DistributedRunner have no --env-pass: the warning names what they read.
    assert "GAUDI_CLUSTER_ENV_PASS=HF_API_KEY" in warning
    assert "hf_abc" not in warning and "a`b`" not in warning


def test_env_pass_of_an_unset_variable_is_bad_input():
    with pytest.raises(ConfigError, match=r"--env-pass NOPE: NOPE is not set.*fix: export NOPE"):
        compose(env_pass=("NOPE",))


# Three containers of one server (one boot id) with 2 CPUs, the simulated cluster of make demo.
ONE_SERVER = {h: {"boot_id": "b1", "cpus": 2} for h in ("master", "worker-1", "worker-2")}


@pytest.mark.parametrize(
    ("ranks", "reports", "expected"),
    [
        ({"master": 1, "worker-1": 1, "worker-2": 1}, ONE_SERVER, (1, 3, 2)),
        # Separate servers (boot ids differ): one rank each keeps torch's own default.
        ({"a": 1, "b": 1}, {"a": {"boot_id": "1", "cpus": 8}, "b": {"boot_id": "2", "cpus": 8}}, None),
        # Two ranks on one 16-CPU node: 8 each, as torchrun/DeepSpeed's core binding would split them.
        ({"a": 2}, {"a": {"boot_id": "1", "cpus": 16}}, (8, 2, 16)),
        # The tightest server sets the count for every node (one env file).
        (
            {"a": 2, "b": 4},
            {"a": {"boot_id": "1", "cpus": 16}, "b": {"boot_id": "2", "cpus": 8}},
            (2, 4, 8),
        ),
        # More ranks than CPUs: never 0 threads.
        ({"a": 4}, {"a": {"boot_id": "1", "cpus": 2}}, (1, 4, 2)),
        # A node of an older image (no boot id, no CPU count) is its own server, left alone.
        ({"a": 1, "b": 1}, {"a": {}, "b": {}}, None),
        ({"a": 3}, {"a": {"boot_id": "1"}}, None),
    ],
)
def test_cpu_threads_split_a_servers_cpus_between_its_ranks(ranks, reports, expected):
    found = cpu_threads.cpu_threads_per_rank(ranks, as_reports(reports))
    assert (None if found is None else (found.threads, found.ranks, found.cpus)) == expected


def test_cpu_threads_never_replace_a_chosen_value_and_name_the_shared_nodes():
    threads = cpu_threads.cpu_threads_per_rank(
        {"master": 1, "worker-1": 1, "worker-2": 1}, as_reports(ONE_SERVER)
    )
    assert threads is not None
    assert (
        "3 ranks share 2 CPUs (one server: nodes master, worker-1, worker-2 report the same kernel boot id)"
        in threads.line()
    )
    plain = EnvFile(items=(("DS_ACCELERATOR", "cpu"),))
    assert cpu_threads.with_cpu_threads(plain, threads).as_dict() == {
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    chosen = EnvFile(items=(("OMP_NUM_THREADS", "2"),))
    assert cpu_threads.with_cpu_threads(chosen, threads) is chosen
    private = EnvFile(items=(), private=(("OMP_NUM_THREADS", "4"),))
    assert cpu_threads.with_cpu_threads(private, threads) is private
    assert cpu_threads.with_cpu_threads(plain, None) is plain
