"""TEST-ONLY job of tests/cluster/test_hpu_shaped.py: one line with what this rank was given.

Plain Python on purpose: the HPU-shaped nodes have no habana_frameworks, so the ranks only show the
environment the master composed for them (preset, .deepspeed_env, the launcher's rank variables).
"""

import json
import os
import socket

NAMES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "DS_ACCELERATOR", "HCCL_OVER_OFI", "HCCL_GAUDI_DIRECT",
    "HCCL_SOCKET_IFNAME", "LD_LIBRARY_PATH", "GC_KERNEL_PATH", "FI_EFA_USE_DEVICE_RDMA", "RDMAV_FORK_SAFE",
)  # fmt: skip
print(
    "RANK-ENV " + json.dumps({"host": socket.gethostname(), **{n: os.environ.get(n) for n in NAMES}}),
    flush=True,
)
