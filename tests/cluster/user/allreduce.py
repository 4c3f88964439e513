"""A user's own job (not the bundled workload): one gloo all-reduce, one result file per rank.

The result records what the launcher gave the rank (its distributed environment and argv), so that
tests can compare launchers. FAIL_RANK=N makes rank N exit 1 after the all-reduce; ECHO_VARS names
variables whose presence (never their values) is recorded.
"""

import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DIST_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
out_dir = os.environ.get("RESULT_DIR", "/workspace/shared")
echo = [name for name in os.environ.get("ECHO_VARS", "").split(",") if name]
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as handle:
    json.dump(
        {
            "rank": rank,
            "world": world,
            "host": socket.gethostname(),
            "sum": value.item(),
            "argv": sys.argv[1:],
            "env": {name: os.environ.get(name) for name in DIST_VARS},
            "cwd": os.getcwd(),
            "pythonpath_head": os.environ.get("PYTHONPATH", "").split(":")[0],
            "present": {name: name in os.environ for name in echo},
        },
        handle,
    )
print(f"rank {rank} of {world} on {socket.gethostname()}: all-reduce sum {value.item()}")
dist.destroy_process_group()
if os.environ.get("FAIL_RANK") == str(rank):
    print(f"rank {rank}: failing on purpose (FAIL_RANK)", flush=True)
    sys.exit(1)
