#!/usr/bin/env python3
"""Drop-in for optimum-habana's examples/gaudi_spawn.py, running through gaudi-cluster.

    python gaudi_spawn.py --world_size 8 --use_mpi run_clm.py <script args>
    python gaudi_spawn.py --hostfile hostfile --use_deepspeed run_clm.py <script args>

GAUDI_CLUSTER_DRY_RUN=1 prints the launch command instead of running it.
"""

from __future__ import annotations

import os
import sys

try:
    import gaudi_cluster  # noqa: F401
except ImportError:
    # Run from a checkout without the image's .pth file: the package sits next to this script.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gaudi_cluster.errors import ConfigError, GaudiClusterError
from gaudi_cluster.spawn import spawn_main


def main(argv: list[str] | None = None) -> int:
    dry_run = os.environ.get("GAUDI_CLUSTER_DRY_RUN", "").strip().lower() in ("1", "true", "yes")
    try:
        return spawn_main(sys.argv[1:] if argv is None else argv, dry_run=dry_run)
    except ConfigError as exc:
        print(f"gaudi_spawn.py: error: {exc}", file=sys.stderr)
        return 2
    except GaudiClusterError as exc:
        print(f"gaudi_spawn.py: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
