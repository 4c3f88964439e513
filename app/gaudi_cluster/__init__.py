"""gaudi-cluster: multi-node DeepSpeed training on Intel Gaudi servers from one Docker image."""

from __future__ import annotations

__version__ = "0.1.0"
