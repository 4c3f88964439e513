"""gaudi-cluster: multi-node DeepSpeed training on Intel Gaudi servers from one Docker image."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["DistributedRunner", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: every rank agent imports this package first, and must not pay for the master's modules.
    if name == "DistributedRunner":
        from gaudi_cluster.spawn import DistributedRunner

        return DistributedRunner
    raise AttributeError(f"module 'gaudi_cluster' has no attribute {name!r}")
