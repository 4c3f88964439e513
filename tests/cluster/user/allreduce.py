"""A user's own job (not the bundled workload): one gloo all-reduce, one result file per rank."""

import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
out_dir = os.environ.get("RESULT_DIR", "/workspace/shared")
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as handle:
    json.dump(
        {
            "rank": rank,
            "world": world,
            "host": socket.gethostname(),
            "sum": value.item(),
            "argv": sys.argv[1:],
        },
        handle,
    )
print(f"rank {rank} of {world} on {socket.gethostname()}: all-reduce sum {value.item()}")
dist.destroy_process_group()
