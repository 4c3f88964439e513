from __future__ import annotations

import shlex

import pytest
from gaudi_cluster.env.envfile import (
    EnvFile,
    is_forwarded,
    is_secret,
    parse_assignments,
    parse_env_file,
    render_env_file,
    split_assignments,
    value_problem,
)
from gaudi_cluster.env.jobenv import UserEnvFile, build_env_file
from gaudi_cluster.env.presets import GAUDINIC_DEFAULTS, PRESETS, default_socket_ifname
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings import profiles
from hypothesis import given
from hypothesis import strategies as st

from tests.support.ds_reference import ds_exports_from_env_file, make_printer, run_remote

MASTER_ENV = {
    "HCCL_COMM_ID": "10.0.0.1:9696",
    "HABANA_LOGS": "/var/log/habana_logs/",
    "HABANA_VISIBLE_MODULES": "0,1",
    "PT_HPU_LAZY_MODE": "1",
    "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
    "FI_PROVIDER": "efa",
    "RDMAV_FORK_SAFE": "1",
    "LD_LIBRARY_PATH": "/usr/lib/habanalabs:/opt/x",
    "PATH": "/usr/local/bin:/usr/bin",
    "PYTHONPATH": "/opt/gaudi-cluster/app",
    "HF_HOME": "/data/hf",
    "HF_TOKEN": "hf_secret",
    "HUGGING_FACE_HUB_TOKEN": "hf_secret",
    "AWS_SECRET_ACCESS_KEY": "s",
    "OPENAI_API_KEY": "k",
    "HF_API_KEY": "k",
    "DS_ACCELERATOR": "hpu",
    "NCCL_SOCKET_IFNAME": "eth1",
    "TORCH_EXTENSIONS_DIR": "/opt/torch-extensions",
    "OMP_NUM_THREADS": "4",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "CUDA_VISIBLE_DEVICES": "0",
    "HOSTNAME": "master",
    "BASH_FUNC_x%%": "() { :; }",
    "OLDPWD": "/",
    "PWD": "/workspace",
    "SHLVL": "1",
    "_": "/usr/bin/python",
    "HOME": "/root",
    "GAUDI_CLUSTER_JOB_ID": "j1",
    "GAUDI_CLUSTER_CONTROL": "10.0.0.1:29400",
    "GAUDI_CLUSTER_PROGRESS_DIR": "/run/gaudi-cluster/jobs/j1",
    "GAUDI_CLUSTER_PEERS": "a,b",
    "HCCL_WEIRD": "a$b",
}


def test_allow_list_from_environ():
    ef = build_env_file(MASTER_ENV, "none", {}, None)
    assert ef.as_dict() == {
        "DS_ACCELERATOR": "hpu",
        "FI_PROVIDER": "efa",
        "GC_KERNEL_PATH": "/usr/lib/habanalabs/libtpc_kernels.so",
        "HABANA_LOGS": "/var/log/habana_logs/",
        "HCCL_COMM_ID": "10.0.0.1:9696",
        "HF_HOME": "/data/hf",
        "LD_LIBRARY_PATH": "/usr/lib/habanalabs:/opt/x",
        "NCCL_SOCKET_IFNAME": "eth1",
        "OMP_NUM_THREADS": "4",
        "PATH": "/usr/local/bin:/usr/bin",
        "PT_HPU_LAZY_MODE": "1",
        "PYTHONPATH": "/opt/gaudi-cluster/app",
        "RDMAV_FORK_SAFE": "1",
        "TORCH_EXTENSIONS_DIR": "/opt/torch-extensions",
    }
    assert [name for name, _ in ef.items] == sorted(name for name, _ in ef.items)
    dropped = dict(ef.dropped)
    assert set(dropped) == {"HF_TOKEN", "HF_API_KEY", "HCCL_WEIRD"}
    assert "'$'" in dropped["HCCL_WEIRD"]


@pytest.mark.parametrize(
    ("name", "forwarded"),
    [
        ("HCCL_OVER_OFI", True),
        ("GLOO_SOCKET_IFNAME", True),
        ("HABANA_VISIBLE_MODULES", False),
        ("HABANA_VISIBLE_DEVICES", False),
        ("MASTER_ADDR", False),
        ("NV_CUDA_VISIBLE_DEVICES", False),
        ("BASH_FUNC_foo%%", False),
        ("HOME", False),
        ("GAUDI_CLUSTER_SSH_DIR", False),
        ("GC_FOO", True),
        ("LOG_LEVEL_ALL", True),
    ],
)
def test_is_forwarded(name, forwarded):
    assert is_forwarded(name) is forwarded


# What the dl1 image's environment holds: its profile's libfabric and Open MPI, set by the build.
DL1 = profiles.load().profile("dl1")
DL1_ENV = {"LIBFABRIC_ROOT": DL1.libfabric_root, "MPI_ROOT": DL1.openmpi.root}


def test_preset_efa():
    environ = {**DL1_ENV, "LD_LIBRARY_PATH": f"{DL1.libfabric_root}/lib:/usr/local/lib::"}
    ef = build_env_file(environ, "efa", {}, "ens32")
    assert ef.as_dict() == {
        **GAUDINIC_DEFAULTS,
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "HCCL_OVER_OFI": "1",
        "HCCL_SOCKET_IFNAME": "ens32",
        # The image's one libfabric first (hccl_ofi_wrapper has no RPATH), then the wrapper and Open MPI.
        "LD_LIBRARY_PATH": f"{DL1.libfabric_root}/lib:/usr/lib/habanalabs:{DL1.openmpi.root}/lib"
        ":/usr/local/lib",
        "RDMAV_FORK_SAFE": "1",
    }


def test_preset_efa_without_existing_path_or_ifname():
    assert PRESETS["efa"](DL1_ENV, None) == {
        **GAUDINIC_DEFAULTS,
        "HCCL_OVER_OFI": "1",
        "LD_LIBRARY_PATH": f"{DL1.libfabric_root}/lib:/usr/lib/habanalabs:{DL1.openmpi.root}/lib",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "RDMAV_FORK_SAFE": "1",
    }


def test_an_image_without_fabric_paths_gets_only_the_wrapper_directory():
    """No path of the presets' own: without LIBFABRIC_ROOT and MPI_ROOT only Habana's directory is added."""
    assert PRESETS["efa"]({}, None)["LD_LIBRARY_PATH"] == "/usr/lib/habanalabs"


def test_preset_hostnic_puts_the_images_libfabric_first():
    gaudi = profiles.load().profile("gaudi")
    environ = {
        "LIBFABRIC_ROOT": gaudi.libfabric_root,
        "MPI_ROOT": gaudi.openmpi.root,
        "LD_LIBRARY_PATH": "/usr/lib/habanalabs:/x",
    }
    assert PRESETS["hostnic"](environ, None) == {
        **GAUDINIC_DEFAULTS,
        "HCCL_OVER_OFI": "1",
        "HCCL_GAUDI_DIRECT": "1",
        "LD_LIBRARY_PATH": f"{gaudi.libfabric_root}/lib:/usr/lib/habanalabs:{gaudi.openmpi.root}/lib:/x",
        "RDMAV_FORK_SAFE": "1",
        "MLX5_SCATTER_TO_CQE": "0",
    }
    assert PRESETS["hostnic"]({}, "ib0")["HCCL_SOCKET_IFNAME"] == "ib0"
    assert "FI_PROVIDER" not in PRESETS["hostnic"]({}, None)


def test_preset_gaudinic_defaults_and_environ_wins():
    assert build_env_file({}, "gaudinic", {}, "eth0").as_dict() == {
        **GAUDINIC_DEFAULTS,
        "HCCL_SOCKET_IFNAME": "eth0",
    }
    custom = PRESETS["gaudinic"]({"GC_KERNEL_PATH": "/custom/libtpc.so"}, None)
    assert custom["GC_KERNEL_PATH"] == "/custom/libtpc.so"
    assert custom["HABANA_SCAL_BIN_PATH"] == "/opt/habanalabs/engines_fw"
    assert "HCCL_SOCKET_IFNAME" not in custom


def test_preset_cpu_and_none():
    assert build_env_file({}, "cpu", {}, "eth0").as_dict() == {
        "DS_ACCELERATOR": "cpu",
        "GLOO_SOCKET_IFNAME": "eth0",
    }
    assert build_env_file({}, "cpu", {}, None).as_dict() == {"DS_ACCELERATOR": "cpu"}
    assert build_env_file({}, "none", {}, "eth0").as_dict() == {}


def test_order_environ_then_preset_then_extra():
    ef = build_env_file({"DS_ACCELERATOR": "hpu"}, "cpu", {"DS_ACCELERATOR": "cuda", "FOO": "1"}, None)
    assert ef.items == (("DS_ACCELERATOR", "cuda"), ("FOO", "1"))


@pytest.mark.parametrize(
    ("preset", "extra", "match"),
    [
        pytest.param("bogus", {}, "GAUDI_CLUSTER_ENV_PRESET='bogus'", id="unknown-preset"),
        pytest.param("none", {"HF_TOKEN": "x"}, "HF_TOKEN looks like a secret", id="explicit-secret"),
        pytest.param("none", {"MY_PASSWORD": "x"}, "MY_PASSWORD", id="password"),
        pytest.param("none", {"MASTER_ADDR": "x"}, "set by the launcher", id="launcher-owned"),
        pytest.param("none", {"X": "a\nb"}, "value of X contains a newline", id="newline"),
        pytest.param("none", {"X": 'a"b'}, "double quote", id="quote"),
        pytest.param("none", {"X": "a%nb"}, "'%'", id="percent"),
        pytest.param("none", {"1X": "a"}, "'1X' is not a valid variable name", id="bad-name"),
    ],
)
def test_build_errors(preset, extra, match):
    with pytest.raises(ConfigError, match=match) as exc:
        build_env_file({}, preset, extra, None)
    assert "fix:" in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("/usr/lib:/opt/lib", True),
        ("a b c", True),
        ("it's", True),
        ("", True),
        ("x=y,z@w+1", True),
        ("a$HOME", False),
        ("a`id`", False),
        ("a\\b", False),
        ('"q"', False),
        ("50%", False),
        ("a\x00", False),
        (" lead", False),
        ("trail ", False),
        ("a\rb", False),
        ("a\x1bb", False),
        ("a\tb", True),
    ],
)
def test_value_problem(value, ok):
    assert (value_problem(value) is None) is ok


def test_render_golden():
    ef = EnvFile((("A", "1"), ("B", "x y"), ("C", "")))
    assert render_env_file(ef) == "A=1\nB=x y\nC=\n"
    assert render_env_file(EnvFile(())) == ""


@pytest.mark.parametrize(
    ("items", "match"),
    [
        pytest.param((("A", "x$y"),), "value of A", id="dollar"),
        pytest.param((("A-B", "1"),), "'A-B'", id="bad-name"),
        pytest.param((("X_TOKEN", "1"),), "X_TOKEN", id="secret"),
    ],
)
def test_render_rejects(items, match):
    with pytest.raises(ConfigError, match=match):
        render_env_file(EnvFile(items))


def test_parse_tolerates_comments_and_blanks():
    text = "# comment\n\nA=1\n  B = two words  \nC=x=y\n"
    assert parse_env_file(text).items == (("A", "1"), ("B", "two words"), ("C", "x=y"))


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        pytest.param("A=1\nNOEQUALS\n", "my.env:2", id="no-equals"),
        pytest.param("1A=1\n", "my.env:1", id="bad-name"),
        pytest.param("export A=1\n", "my.env:1", id="export"),
    ],
)
def test_parse_errors(text, culprit):
    with pytest.raises(ConfigError) as exc:
        parse_env_file(text, "my.env")
    assert str(exc.value).startswith(culprit + ":")
    assert "fix:" in str(exc.value)


_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True).filter(lambda n: value_problem(n) is None)
_values = st.text(
    alphabet=st.characters(blacklist_characters='"\\$`%', blacklist_categories=("Cs", "Cc")), max_size=30
).map(str.strip)


@given(st.dictionaries(_names.filter(lambda n: not is_secret(n)), _values, max_size=8))
def test_round_trip(values):
    ef = EnvFile(tuple(sorted(values.items())))
    assert parse_env_file(render_env_file(ef)) == ef


def test_values_survive_deepspeed_pdsh_and_remote_shell(tmp_path):
    values = {
        "SPACES": "a  b c",
        "SINGLE": "it's",
        "BANG": "hi!",
        "PATHS": "/usr/lib/habanalabs:/opt/amazon/efa/lib",
        "EMPTY": "",
        "SEMI": "a;b&c|d",
        "GLOB": "*.py",
        "PAREN": "(x) <y>",
        "UNICODE": "café",
        "EQ": "k=v",
    }
    text = render_env_file(EnvFile(tuple(sorted(values.items()))))
    exports = ds_exports_from_env_file(text)
    line = "".join(f"export {k}={v}; " for k, v in exports.items())
    printer = make_printer(tmp_path)
    env = run_remote([line, printer], "h", 0, tmp_path)["env"]
    assert {k: env.get(k) for k in values} == values


def test_default_socket_ifname():
    assert default_socket_ifname(["lo", "docker0", "eth0", "ens5"]) == "eth0"
    assert default_socket_ifname(["lo", "docker0"]) is None
    assert default_socket_ifname(["ens32", "eth0"]) == "ens32"


def test_assignments_from_lists_and_repeated_flags():
    assert split_assignments(["A=1; B = x=y ;;C="], "GAUDI_CLUSTER_ENV") == {"A": "1", "B": "x=y", "C": ""}
    assert split_assignments([""], "--env") == {}
    assert split_assignments(["A=1", "B=c d;C=3"], "--env") == {"A": "1", "B": "c d", "C": "3"}
    assert parse_assignments(["A=1;2"], "--env") == {"A": "1;2"}


@pytest.mark.parametrize(
    ("spec", "match"),
    [("A=1;B", "--env: 'B' has no '='"), ("1A=2", "--env: '1A'")],
)
def test_assignment_errors_name_their_source(spec, match):
    with pytest.raises(ConfigError, match=match) as exc:
        split_assignments([spec], "--env")
    assert "fix:" in str(exc.value)


def test_a_launcher_gets_no_secret_named_variable():
    from gaudi_cluster.env.envfile import launcher_environment

    environ = {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/app",
        "NCCL_DEBUG": "INFO",
        "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        "MLFLOW_TRACKING_PASSWORD": "p",
        "HF_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s",
        "WANDB_API_KEY": "k",
        "HF_ENDPOINT": "https://user:pass@hub.example",
        "PIP_INDEX_URL": "https://tok123@pypi.example/simple",
    }
    # MLFLOW*: DeepSpeed's runner would export every one onto the pdsh command line (the private file
    # carries them); a URL with userinfo is a secret whatever its name.
    assert launcher_environment(environ) == {"PATH": "/usr/bin", "PYTHONPATH": "/app", "NCCL_DEBUG": "INFO"}


def test_the_launchers_logged_command_shows_names_not_values():
    from gaudi_cluster.env.envfile import mask_secrets

    line = "cmd = pdsh -S -f 1024 -w a,b export PYTHONPATH=/x; export MLFLOW_X='a b'; export N=\"q r\"; cd /w"
    assert (
        mask_secrets(line)
        == "cmd = pdsh -S -f 1024 -w a,b export PYTHONPATH=***; export MLFLOW_X=***; export N=***; cd /w"
    )


SECRET = "hf_" + "Zq9" * 8


@pytest.mark.parametrize(
    "argv, named",
    [
        (["train.py", "--hub_token", SECRET, "--epochs", "1"], "--hub_token"),
        (["train.py", f"--token={SECRET}"], "--token"),
        (["train.py", f"hub_token={SECRET}"], "hub_token"),
        (["train.py", "--hf-token", SECRET], "--hf-token"),
        (["train.py", "--report_to", f"https://user:{SECRET}@mlflow.example"], "--report_to"),
    ],
)
def test_a_token_argument_is_masked_in_the_log_line_and_named_in_the_warning(argv, named):
    from gaudi_cluster.env.envfile import mask_secrets, secret_arguments

    line = mask_secrets(shlex.join(["deepspeed", "--hostfile", "/j/hostfile", *argv]))
    assert SECRET not in line and "***" in line
    assert "train.py" in line and "--hostfile /j/hostfile" in line
    assert secret_arguments(argv) == [named]


def test_arguments_that_only_resemble_a_token_are_kept():
    from gaudi_cluster.env.envfile import mask_secrets, secret_arguments

    argv = ["train.py", "--tokenizer_name", "gpt2", "--max_tokens=5", "--push_to_hub", "--output_dir", "/o"]
    assert secret_arguments(argv) == []
    assert mask_secrets(shlex.join(argv)) == shlex.join(argv)


def test_a_url_with_userinfo_is_a_secret_and_goes_through_the_private_file():
    from gaudi_cluster.env.jobenv import private_values

    environ = {"MLFLOW_TRACKING_URI": f"https://u:{SECRET}@mlflow.example", "MLFLOW_EXPERIMENT_NAME": "e"}
    user = [UserEnvFile("/home/u/.deepspeed_env", (("HF_ENDPOINT", f"https://{SECRET}@hub.example"),))]
    private = private_values(user, (), environ)
    assert private == {**environ, "HF_ENDPOINT": f"https://{SECRET}@hub.example"}
    env = build_env_file({"HF_ENDPOINT": f"https://u:{SECRET}@hub"}, "none", {}, None)
    assert env.as_dict() == {} and env.dropped == (("HF_ENDPOINT", "looks like a secret"),)
    with pytest.raises(ConfigError, match="looks like a secret"):
        build_env_file({}, "none", {"DATA_URL": f"https://u:{SECRET}@data"}, None)


def test_the_launching_line_masks_token_arguments_and_the_warning_names_the_fix():
    from gaudi_cluster.env.envfile import secret_arguments_warning
    from gaudi_cluster.launch.plan import LaunchPlan, log_line

    program = ["train.py", "--hub_token", SECRET, "--data", f"https://u:{SECRET}@data.example/x"]
    line = log_line(LaunchPlan(("deepspeed", "--hostfile", "/j/h", *program), {"PDSH_RCMD_TYPE": "ssh"}))
    assert SECRET not in line and "--hub_token ***" in line and "https://***@data.example/x" in line
    warning = secret_arguments_warning(program)
    assert warning is not None and "\n" not in warning and SECRET not in warning
    assert "--hub_token, --data" in warning and "visible to `ps`" in warning and "--env-pass" in warning
    assert secret_arguments_warning(["train.py", "--epochs", "1"]) is None
