#!/usr/bin/env python3
"""Drop-in for optimum-habana's examples/gaudi_spawn.py, running through gaudi-cluster.

    python gaudi_spawn.py --world_size 8 --use_mpi run_clm.py <script args>
    python gaudi_spawn.py --hostfile hostfile --use_deepspeed run_clm.py <script args>
    python gaudi_spawn.py --dry-run --hostfile hostfile --use_deepspeed run_clm.py <script args>

`gaudi_spawn.py --help` lists every flag; GAUDI_CLUSTER_DRY_RUN=1 works like --dry-run.
"""

from __future__ import annotations

import os
import sys

try:
    import gaudi_cluster  # noqa: F401
except ImportError:
    # Run from a checkout without the image's .pth file: the package sits next to this script.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gaudi_cluster.spawn import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "gaudi_spawn.py"))
