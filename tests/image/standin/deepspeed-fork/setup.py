"""TEST-ONLY stand-in for HabanaAI/DeepSpeed's setup.py (never shipped): like the fork's, it records the
git hash of the checkout pip built it from in deepspeed/git_version_info_installed.py, and its version is
version.txt + build.txt (+hpu.synapse.vX), which is what image/install-python.sh checks."""

import subprocess
from pathlib import Path

from setuptools import setup

here = Path(__file__).parent
git_hash = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=here, text=True).strip()
(here / "deepspeed" / "git_version_info_installed.py").write_text(f"git_hash = '{git_hash}'\n")
version = (here / "version.txt").read_text().strip() + (here / "build.txt").read_text().strip()
setup(name="deepspeed", version=version, packages=["deepspeed"])
