"""The entrypoint's GAUDI_CLUSTER_MASTER_ENV_DIR: each file a variable of the master's environment (the
Indexed Job's HF token reaches the master's container alone; issue 35)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENTRYPOINT = Path(__file__).resolve().parents[2] / "entrypoint" / "entrypoint.sh"
# Sourced, then the one function: what the master would be started with, by name.
SHOW = 'source "$1"; ep_master_env; printf "%s|%s" "${HF_TOKEN-unset}" "${OTHER_SECRET-unset}"'


def master_env(directory: Path | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"]}
    if directory is not None:
        env["GAUDI_CLUSTER_MASTER_ENV_DIR"] = str(directory)
    return subprocess.run(
        ["bash", "-c", SHOW, "test", str(ENTRYPOINT)], env=env, capture_output=True, text=True, check=False
    )


def test_each_file_becomes_a_variable_of_its_name(tmp_path):
    (tmp_path / "HF_TOKEN").write_text("hf_abc def\n")  # kubectl --from-file keeps what it is given
    (tmp_path / "OTHER_SECRET").write_text("x=y")
    (tmp_path / ".hidden").write_text("ignored")  # a Secret volume's ..data entries are dot names
    done = master_env(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hf_abc def|x=y"


def test_unset_or_empty_gives_nothing(tmp_path):
    assert master_env(None).stdout == "unset|unset"
    assert master_env(tmp_path).stdout == "unset|unset"


def test_a_bad_name_or_a_missing_directory_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "hf-token").write_text("hf_abc")
    done = master_env(tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "'hf-token' is not a variable name; fix:" in done.stderr
    assert "hf_abc" not in done.stderr
    done = master_env(tmp_path / "absent")
    assert done.returncode == 2 and "is not a directory; fix: mount one there or unset it" in done.stderr
